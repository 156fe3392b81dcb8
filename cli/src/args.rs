//! A small argument parser: positionals in order, `--flag`, `--key value` / `--key=value`; anything left
//! unconsumed is an error (a typo'd option must not be silently ignored).

use crate::CliError;

/// Options that take a value (`--device 0`); every other `--x` is a flag.
const VALUE_OPTIONS: &[&str] = &[
    "device", "memory", "sm", "policy", "weight", "priority", "usage", "interval",
];

enum Item {
    Positional(String),
    Flag(String),
    Value(String, Option<String>),
}

/// Remaining command-line arguments.
pub struct Args {
    items: Vec<Option<Item>>,
}

impl Args {
    /// Wraps the arguments after the program name.
    pub fn new(argv: Vec<String>) -> Args {
        let mut items = Vec::new();
        let mut it = argv.into_iter();
        while let Some(a) = it.next() {
            let item = match a.strip_prefix("--") {
                Some(rest) => match rest.split_once('=') {
                    Some((k, v)) => Item::Value(k.to_string(), Some(v.to_string())),
                    None if VALUE_OPTIONS.contains(&rest) => Item::Value(rest.to_string(), it.next()),
                    None => Item::Flag(rest.to_string()),
                },
                None => Item::Positional(a),
            };
            items.push(Some(item));
        }
        Args { items }
    }

    /// The next positional argument.
    pub fn next_positional(&mut self) -> Option<String> {
        let i = self
            .items
            .iter()
            .position(|x| matches!(x, Some(Item::Positional(_))))?;
        match self.items[i].take() {
            Some(Item::Positional(s)) => Some(s),
            _ => None,
        }
    }

    /// A required positional.
    pub fn positional(&mut self, what: &str) -> Result<String, CliError> {
        self.next_positional()
            .ok_or_else(|| CliError(format!("missing {what}")))
    }

    /// Whether `--name` is present (consumed).
    pub fn flag(&mut self, name: &str) -> bool {
        match self
            .items
            .iter()
            .position(|x| matches!(x, Some(Item::Flag(f)) if f == name))
        {
            Some(i) => {
                self.items[i] = None;
                true
            }
            None => false,
        }
    }

    /// The value of `--name VALUE` / `--name=VALUE` if present (consumed).
    pub fn value(&mut self, name: &str) -> Result<Option<String>, CliError> {
        let Some(i) = self
            .items
            .iter()
            .position(|x| matches!(x, Some(Item::Value(k, _)) if k == name))
        else {
            return Ok(None);
        };
        match self.items[i].take() {
            Some(Item::Value(_, Some(v))) => Ok(Some(v)),
            _ => Err(CliError(format!("--{name} needs a value"))),
        }
    }

    /// Errors if anything was not consumed.
    pub fn finish(self) -> Result<(), CliError> {
        let left: Vec<String> = self
            .items
            .into_iter()
            .flatten()
            .map(|i| match i {
                Item::Positional(s) => s,
                Item::Flag(f) => format!("--{f}"),
                Item::Value(k, v) => format!("--{k} {}", v.unwrap_or_default()),
            })
            .collect();
        if left.is_empty() {
            Ok(())
        } else {
            Err(CliError(format!("unexpected argument(s): {}", left.join(" "))))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(s: &str) -> Args {
        Args::new(s.split_whitespace().map(String::from).collect())
    }

    #[test]
    fn options_anywhere_and_equals_form() {
        let mut a = args("set --memory=4g --device 0 file --json");
        assert_eq!(a.next_positional().as_deref(), Some("set"));
        assert_eq!(a.next_positional().as_deref(), Some("file"));
        assert_eq!(a.value("device").unwrap().as_deref(), Some("0"));
        assert_eq!(a.value("memory").unwrap().as_deref(), Some("4g"));
        assert!(a.flag("json"));
        assert!(a.finish().is_ok());
    }

    #[test]
    fn leftovers_and_missing_values_are_errors() {
        let mut a = args("show file --jsno");
        a.next_positional();
        a.next_positional();
        assert!(!a.flag("json"));
        assert!(a.finish().is_err());
        let mut a = args("--memory");
        assert!(a.value("memory").is_err());
    }
}

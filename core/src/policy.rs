//! [`Policy`]: the one description of what a device may use — memory cap and request, SM share, how the share is
//! enforced, burst weight, priority and memory reserved for high-priority tenants.
//!
//! Every source produces one: the environment and the TOML file (`crate::config`, per CUDA ordinal), a limits
//! file entry (`crate::region`, decoded from its [`PolicyRaw`] words). They combine with [`Policy::restrict`],
//! and the result is used unchanged by the shim's memory accounting, its SM throttle and `cuquota status`.
//! [`PolicyRaw`] is the only way a policy is packed into words (limits entries, usage device entries, the
//! shim's per-device cache): adding a field means adding it here, to its words and to `include/cuquota.h`.

/// Limits entry `policy`: default.
pub const POLICY_DEFAULT: u32 = 0;
/// Limits entry `policy`: hard.
pub const POLICY_HARD: u32 = 1;
/// Limits entry `policy`: burst.
pub const POLICY_BURST: u32 = 2;
/// Limits entry `policy`: SM limiting disabled.
pub const POLICY_DISABLED: u32 = 3;

/// Policy `priority`: not set.
pub const PRIORITY_NONE: u32 = 0;
/// Policy `priority`: high (HAMi `CUDA_TASK_PRIORITY=0`).
pub const PRIORITY_HIGH: u32 = 1;
/// Policy `priority`: low, best effort (HAMi `CUDA_TASK_PRIORITY=1`).
pub const PRIORITY_LOW: u32 = 2;

/// Burst weight used when none is set.
pub const DEFAULT_WEIGHT: u32 = 100;

/// How the SM share is enforced.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum PolicyKind {
    /// Not stated: cuquota's default, which behaves as [`PolicyKind::Burst`].
    #[default]
    Default,
    /// Never above the share, even on an idle GPU (`CUQUOTA_POLICY=hard`, HAMi `FORCE`).
    Hard,
    /// Work-conserving: beyond the share while no one else wants the time, split by weight.
    Burst,
    /// The SM share of this source is switched off (`GPU_CORE_UTILIZATION_POLICY=DISABLE`). Another source's
    /// share (the agent's) still applies.
    Disabled,
}

impl PolicyKind {
    /// Parses a policy name, any case: `hard` (or HAMi's `force`), `burst`, `disabled` (or `disable`), `default`.
    pub fn parse(s: &str) -> Option<PolicyKind> {
        match s.trim().to_ascii_lowercase().as_str() {
            "hard" | "force" => Some(PolicyKind::Hard),
            "burst" => Some(PolicyKind::Burst),
            "disable" | "disabled" => Some(PolicyKind::Disabled),
            "default" => Some(PolicyKind::Default),
            _ => None,
        }
    }

    /// Lower-case name, as [`PolicyKind::parse`] accepts it.
    pub fn as_str(self) -> &'static str {
        match self {
            PolicyKind::Default => "default",
            PolicyKind::Hard => "hard",
            PolicyKind::Burst => "burst",
            PolicyKind::Disabled => "disabled",
        }
    }

    /// The stricter of two: hard over burst over default; a disabled source has no say on enforcement.
    pub fn stricter(a: PolicyKind, b: PolicyKind) -> PolicyKind {
        let rank = |k: PolicyKind| match k {
            PolicyKind::Disabled => 0,
            PolicyKind::Default => 1,
            PolicyKind::Burst => 2,
            PolicyKind::Hard => 3,
        };
        if rank(a) >= rank(b) {
            a
        } else {
            b
        }
    }
}

/// Scheduling priority of a tenant (HAMi's `CUDA_TASK_PRIORITY`: 0 = high, 1 = low).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Priority {
    /// Latency-critical: best-effort tenants make room for it.
    High,
    /// Best effort: uses what high-priority tenants leave.
    Low,
}

impl Priority {
    /// Parses `high` / `low` (any case) or HAMi's numbers `0` (high) / `1` (low).
    pub fn parse(s: &str) -> Option<Priority> {
        match s.trim().to_ascii_lowercase().as_str() {
            "high" | "0" => Some(Priority::High),
            "low" | "1" => Some(Priority::Low),
            _ => None,
        }
    }

    /// Lower-case name.
    pub fn as_str(self) -> &'static str {
        match self {
            Priority::High => "high",
            Priority::Low => "low",
        }
    }
}

/// A device's limits from one source, or combined. `None` = not limited (not set) by this source.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Policy {
    /// Device-memory cap, bytes.
    pub memory: Option<u64>,
    /// SM-time share, percent 1–99 (see [`Policy::sm_share`] for whether it applies).
    pub sm: Option<u32>,
    /// How the SM share is enforced.
    pub kind: PolicyKind,
    /// Share of spare time in burst mode, 1–1000 (`None` = [`DEFAULT_WEIGHT`]).
    pub weight: Option<u32>,
    /// Scheduling priority.
    pub priority: Option<Priority>,
    /// Device memory kept free for high-priority tenants, bytes.
    pub reserved_memory: Option<u64>,
    /// Guaranteed device memory, bytes (the Kubernetes request); `None` = the cap (not elastic). Read and
    /// shown, not yet acted on (no eviction yet): see [`Policy::request_in_force`].
    pub memory_request: Option<u64>,
}

/// A memory request that cannot be stored: what was wrong, with the figures.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RequestError {
    /// The request is above the memory limit.
    AboveLimit {
        /// Request, bytes.
        request: u64,
        /// Limit, bytes.
        limit: u64,
    },
    /// A request where no memory limit is set (the request is what the limit guarantees of it).
    WithoutLimit {
        /// Request, bytes.
        request: u64,
    },
}

impl std::fmt::Display for RequestError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        use crate::units::format_size;
        match *self {
            RequestError::AboveLimit { request, limit } => write!(
                f,
                "memory request {} ({request} bytes) is above the memory limit {} ({limit} bytes): a request is \
                 at most the limit",
                format_size(request),
                format_size(limit)
            ),
            RequestError::WithoutLimit { request } => write!(
                f,
                "memory request {} ({request} bytes) without a memory limit: set the limit too",
                format_size(request)
            ),
        }
    }
}

impl std::error::Error for RequestError {}

impl Policy {
    /// No limits at all.
    pub const NONE: Policy = Policy {
        memory: None,
        sm: None,
        kind: PolicyKind::Default,
        weight: None,
        priority: None,
        reserved_memory: None,
        memory_request: None,
    };

    /// The memory this policy guarantees: the request, never above the cap; the cap when no request is set
    /// (not elastic); `None` without a cap (nothing is promised to an uncapped tenant). A malformed request
    /// (above the cap, from a foreign writer) never counts for more than the cap.
    #[inline]
    pub fn request_in_force(&self) -> Option<u64> {
        let limit = self.memory?;
        Some(self.memory_request.map_or(limit, |r| r.min(limit)))
    }

    /// Whether the cap is above the guarantee (the tenant is elastic).
    pub fn is_elastic(&self) -> bool {
        self.request_in_force().is_some_and(|r| Some(r) < self.memory)
    }

    /// Checks the request against the cap: `Err` for a request above it or without one. What writers (the
    /// CLI, the DRA plugin) check before storing an entry.
    pub fn check_request(&self) -> Result<(), RequestError> {
        match (self.memory_request, self.memory) {
            (Some(request), None) => Err(RequestError::WithoutLimit { request }),
            (Some(request), Some(limit)) if request > limit => {
                Err(RequestError::AboveLimit { request, limit })
            }
            _ => Ok(()),
        }
    }

    /// The SM share that applies: the percentage unless this policy disables SM limiting (0 and ≥ 100 are never
    /// stored: they mean "no limit").
    #[inline]
    pub fn sm_share(&self) -> Option<u32> {
        match self.kind {
            PolicyKind::Disabled => None,
            _ => self.sm.filter(|p| (1..100).contains(p)),
        }
    }

    /// Whether launches are throttled at all.
    #[inline]
    pub fn throttles(&self) -> bool {
        self.sm_share().is_some()
    }

    /// The SM share in per-mille of the device (1000 = the whole device when unlimited).
    #[inline]
    pub fn rate_pm(&self) -> u64 {
        self.sm_share().map_or(1000, |p| p as u64 * 10)
    }

    /// Work-conserving enforcement (burst, which is also the default).
    #[inline]
    pub fn is_burst(&self) -> bool {
        matches!(self.kind, PolicyKind::Burst | PolicyKind::Default)
    }

    /// The burst weight in force.
    #[inline]
    pub fn weight_or_default(&self) -> u32 {
        self.weight.unwrap_or(DEFAULT_WEIGHT)
    }

    /// This policy tightened by `other` (an agent's): the lower memory cap, the lower SM share, the stricter
    /// enforcement, the lower weight (unset = [`DEFAULT_WEIGHT`]), the lower priority, the larger reservation,
    /// the lower request (never above the cap in force).
    /// So nothing a process states for itself can loosen what the agent wrote.
    pub fn restrict(self, other: &Policy) -> Policy {
        let memory = min_limit(self.memory, other.memory);
        Policy {
            memory,
            sm: min_limit(self.sm_share(), other.sm_share()),
            kind: PolicyKind::stricter(self.kind, other.kind),
            // An unset weight is the default (100), not infinity: a process asking more where the operator's
            // file sets none does not get it.
            weight: match (self.weight, other.weight) {
                (None, None) => None,
                (a, b) => Some(a.unwrap_or(DEFAULT_WEIGHT).min(b.unwrap_or(DEFAULT_WEIGHT))),
            },
            priority: match (self.priority, other.priority) {
                (Some(Priority::Low), _) | (_, Some(Priority::Low)) => Some(Priority::Low),
                (a, b) => a.or(b),
            },
            reserved_memory: self.reserved_memory.max(other.reserved_memory),
            // A lower request is the stricter (less guaranteed); never above the cap in force.
            memory_request: min_limit(self.memory_request, other.memory_request)
                .map(|r| memory.map_or(r, |m| r.min(m))),
        }
    }

    /// The words this policy is stored as.
    pub fn raw(&self) -> PolicyRaw {
        PolicyRaw {
            memory_limit: self.memory.unwrap_or(0),
            memory_request: self.memory_request.unwrap_or(0),
            reserved_memory: self.reserved_memory.unwrap_or(0),
            sm_limit: self.sm.unwrap_or(0),
            policy: match self.kind {
                PolicyKind::Default => POLICY_DEFAULT,
                PolicyKind::Hard => POLICY_HARD,
                PolicyKind::Burst => POLICY_BURST,
                PolicyKind::Disabled => POLICY_DISABLED,
            },
            weight: self.weight.unwrap_or(0),
            priority: match self.priority {
                None => PRIORITY_NONE,
                Some(Priority::High) => PRIORITY_HIGH,
                Some(Priority::Low) => PRIORITY_LOW,
            },
        }
    }
}

/// The lower of two optional limits, `None` meaning "no limit" (∞).
pub fn min_limit<T: Ord>(a: Option<T>, b: Option<T>) -> Option<T> {
    match (a, b) {
        (Some(x), Some(y)) => Some(x.min(y)),
        (x, None) => x,
        (None, y) => y,
    }
}

/// A [`Policy`] as stored in the region (`struct cuquota_policy`): plain integers, 0 = not set. Copied out of
/// and into the atomic words by `region::layout::PolicyWords`; decoded by [`PolicyRaw::decode`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct PolicyRaw {
    /// Bytes, 0 = none.
    pub memory_limit: u64,
    /// Guaranteed bytes, 0 = none (the limit). Stored in limits entries only (`LimitsEntry::memory_request`):
    /// a usage device entry has no word for it, so it reads 0 there.
    pub memory_request: u64,
    /// Bytes kept for high-priority tenants, 0 = none.
    pub reserved_memory: u64,
    /// Percent; 0 and ≥ 100 = none.
    pub sm_limit: u32,
    /// `POLICY_*`; an unknown value reads as default.
    pub policy: u32,
    /// Burst weight, 0 = default.
    pub weight: u32,
    /// `PRIORITY_*`; an unknown value reads as none.
    pub priority: u32,
}

impl PolicyRaw {
    /// What the words mean.
    pub fn decode(&self) -> Policy {
        Policy {
            memory: (self.memory_limit != 0).then_some(self.memory_limit),
            sm: (1..100).contains(&self.sm_limit).then_some(self.sm_limit),
            kind: match self.policy {
                POLICY_HARD => PolicyKind::Hard,
                POLICY_BURST => PolicyKind::Burst,
                POLICY_DISABLED => PolicyKind::Disabled,
                _ => PolicyKind::Default,
            },
            weight: (self.weight != 0).then_some(self.weight),
            priority: match self.priority {
                PRIORITY_HIGH => Some(Priority::High),
                PRIORITY_LOW => Some(Priority::Low),
                _ => None,
            },
            reserved_memory: (self.reserved_memory != 0).then_some(self.reserved_memory),
            memory_request: (self.memory_request != 0).then_some(self.memory_request),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const HARD30: Policy = Policy {
        memory: Some(4 << 30),
        sm: Some(30),
        kind: PolicyKind::Hard,
        weight: Some(7),
        priority: Some(Priority::High),
        reserved_memory: Some(1 << 30),
        memory_request: Some(2 << 30),
    };

    #[test]
    fn words_round_trip() {
        for p in [
            Policy::NONE,
            HARD30,
            Policy {
                kind: PolicyKind::Disabled,
                priority: Some(Priority::Low),
                ..HARD30
            },
        ] {
            assert_eq!(p.raw().decode(), p);
        }
        // 0 and ≥ 100 are "no limit"; unknown codes read as not set
        let raw = PolicyRaw {
            sm_limit: 100,
            policy: 9,
            priority: 9,
            ..Default::default()
        };
        assert_eq!(raw.decode(), Policy::NONE);
    }

    #[test]
    fn restrict_takes_the_stricter_of_everything() {
        let env = Policy {
            memory: Some(8 << 30),
            sm: Some(50),
            kind: PolicyKind::Burst,
            weight: Some(300),
            priority: Some(Priority::High),
            reserved_memory: None,
            memory_request: None,
        };
        assert_eq!(
            env.restrict(&HARD30),
            Policy {
                weight: Some(7),
                ..HARD30
            }
        );
        assert_eq!(HARD30.restrict(&Policy::NONE), HARD30);
        assert_eq!(Policy::NONE.restrict(&HARD30), HARD30);
        let low = Policy {
            priority: Some(Priority::Low),
            ..Policy::NONE
        };
        assert_eq!(HARD30.restrict(&low).priority, Some(Priority::Low));
    }

    #[test]
    fn a_weight_above_the_default_needs_the_operator() {
        // The process's own environment asks weight 1000; the operator's entry sets no weight (the default).
        let env = Policy {
            weight: Some(1000),
            ..Policy::NONE
        };
        let agent = Policy {
            memory: Some(4 << 30),
            ..Policy::NONE
        };
        assert_eq!(env.restrict(&agent).weight_or_default(), DEFAULT_WEIGHT);
        assert_eq!(agent.restrict(&env).weight_or_default(), DEFAULT_WEIGHT);
        // Control: a lower weight is the process's to take, a higher one the operator's to grant.
        let light = Policy {
            weight: Some(20),
            ..Policy::NONE
        };
        assert_eq!(light.restrict(&agent).weight, Some(20));
        let granted = Policy {
            weight: Some(500),
            ..agent
        };
        assert_eq!(env.restrict(&granted).weight, Some(500));
        assert_eq!(Policy::NONE.restrict(&Policy::NONE).weight, None);
    }

    #[test]
    fn disabled_drops_only_its_own_share() {
        let off = Policy {
            sm: Some(30),
            kind: PolicyKind::Disabled,
            ..Policy::NONE
        };
        assert_eq!(off.sm_share(), None);
        assert!(!off.throttles());
        let agent = Policy {
            sm: Some(40),
            kind: PolicyKind::Hard,
            ..Policy::NONE
        };
        let eff = off.restrict(&agent);
        assert_eq!((eff.sm_share(), eff.kind), (Some(40), PolicyKind::Hard));
        assert_eq!(agent.restrict(&off).sm_share(), Some(40));
        assert_eq!(off.restrict(&off).sm_share(), None);
    }

    #[test]
    fn names_parse() {
        assert_eq!(PolicyKind::parse(" FORCE "), Some(PolicyKind::Hard));
        assert_eq!(PolicyKind::parse("Disable"), Some(PolicyKind::Disabled));
        assert_eq!(PolicyKind::parse("soft"), None);
        for k in [
            PolicyKind::Default,
            PolicyKind::Hard,
            PolicyKind::Burst,
            PolicyKind::Disabled,
        ] {
            assert_eq!(PolicyKind::parse(k.as_str()), Some(k));
        }
        assert_eq!(Priority::parse("0"), Some(Priority::High));
        assert_eq!(Priority::parse("LOW"), Some(Priority::Low));
        assert_eq!(Priority::parse("2"), None);
    }

    #[test]
    fn a_request_is_checked_against_the_cap_and_never_counts_above_it() {
        let cap = |m: u64, r: Option<u64>| Policy {
            memory: Some(m),
            memory_request: r,
            ..Policy::NONE
        };
        // Control: no request = the cap (not elastic); a request at or below it is stored as given.
        assert_eq!(cap(8, None).check_request(), Ok(()));
        assert_eq!(cap(8, None).request_in_force(), Some(8));
        assert!(!cap(8, None).is_elastic() && !cap(8, Some(8)).is_elastic());
        assert_eq!(cap(8, Some(2)).check_request(), Ok(()));
        assert_eq!(cap(8, Some(2)).request_in_force(), Some(2));
        assert!(cap(8, Some(2)).is_elastic());
        // Attack: above the cap, or without one, is refused by writers, and a reader counts at most the cap.
        assert_eq!(
            cap(8, Some(9)).check_request(),
            Err(RequestError::AboveLimit { request: 9, limit: 8 })
        );
        assert_eq!(cap(8, Some(9)).request_in_force(), Some(8));
        let bare = Policy {
            memory_request: Some(4),
            ..Policy::NONE
        };
        assert_eq!(
            bare.check_request(),
            Err(RequestError::WithoutLimit { request: 4 })
        );
        assert_eq!(bare.request_in_force(), None);
        let e = cap(1 << 30, Some(2 << 30))
            .check_request()
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("2 GiB") && e.contains("1 GiB") && e.contains("request"),
            "{e}"
        );
        // Combined: the lower request, clamped to the lower cap; a process cannot raise the agent's.
        assert_eq!(cap(8, Some(6)).restrict(&cap(4, Some(2))), cap(4, Some(2)));
        assert_eq!(cap(8, Some(6)).restrict(&cap(4, None)), cap(4, Some(4)));
        assert_eq!(cap(8, None).restrict(&cap(4, None)).memory_request, None);
        assert_eq!(cap(8, Some(7)).restrict(&cap(8, Some(3))).memory_request, Some(3));
    }

    #[test]
    fn min_limit_treats_none_as_infinity() {
        assert_eq!(min_limit(Some(3u64), None), Some(3));
        assert_eq!(min_limit(None, Some(4u64)), Some(4));
        assert_eq!(min_limit(Some(5u64), Some(2)), Some(2));
        assert_eq!(min_limit::<u64>(None, None), None);
    }
}

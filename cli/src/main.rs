//! `cuquota`: the node-agent tool.
fn main() {}

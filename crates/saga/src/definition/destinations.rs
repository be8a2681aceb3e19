//! Where a saga's messages go: its orchestrator's destination per version, and the
//! destination that starts and undoes its children.

/// The orchestrator destination of saga `name` at `version`: `saga.<name>.v<version>`.
/// One per version, so that only processes that have the version consume its replies.
pub fn orchestrator_destination(name: &str, version: i32) -> String {
    format!("saga.{name}.v{version}")
}

/// Where a parent's step sends the start (its command) and the undo (its compensation)
/// of child saga `name` ([`Step::saga`](crate::Step::saga)): `saga.<name>.child`,
/// consumed by every process that hosts a version of `name` (the newest one it hosts
/// starts the child).
pub fn child_destination(name: &str) -> String {
    format!("saga.{name}.child")
}

/// The saga name whose children `destination` starts, if it is a
/// [`child_destination`].
pub(crate) fn child_of(destination: &str) -> Option<&str> {
    destination.strip_prefix("saga.")?.strip_suffix(".child")
}

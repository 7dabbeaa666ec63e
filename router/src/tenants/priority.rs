//! A request's priority class: named in the tenants file, lowered by a
//! header, and read by the admission queue (which serves classes in
//! order) and the fleet-wide shedding (which refuses sheddable first).

use std::fmt;

use serde::Serialize;

/// A request's class: a waiter of a higher class is always served before
/// any of a lower one, and sheddable traffic is refused first when the
/// fleet is saturated.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Priority {
    /// Interactive traffic that must not wait behind anything.
    Critical,
    /// The default.
    #[default]
    Standard,
    /// Batch traffic: served last, and shed first.
    Sheddable,
}

impl Priority {
    /// Every class, highest first (the order queues are served in).
    pub const ALL: [Priority; 3] = [Priority::Critical, Priority::Standard, Priority::Sheddable];

    /// Its position in [`Priority::ALL`].
    pub fn index(self) -> usize {
        self as usize
    }

    /// Its name, as in the header, the tenants file and metric labels.
    pub fn name(self) -> &'static str {
        match self {
            Priority::Critical => "critical",
            Priority::Standard => "standard",
            Priority::Sheddable => "sheddable",
        }
    }

    /// The class named `text`, if it is one.
    pub fn parse(text: &str) -> Option<Priority> {
        Priority::ALL.into_iter().find(|p| p.name() == text)
    }
}

impl fmt::Display for Priority {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

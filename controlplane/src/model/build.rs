//! A published node build, as the store keeps it.

use qe_shared::node_channel::DesiredBuild;
use serde::{Deserialize, Serialize};

/// A published build.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Build {
    pub sha256: String,
    pub size: u64,
    /// The CPU it is built for: `x86_64` or `aarch64` (its ELF header's).
    pub architecture: String,
    /// The operator's name for it (a version, a commit), if given.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub label: Option<String>,
    /// When it was published, in seconds since 1970.
    pub published: u64,
}

impl Build {
    pub fn desired(&self) -> DesiredBuild {
        DesiredBuild {
            binary_sha256: self.sha256.clone(),
            size: self.size,
        }
    }
}

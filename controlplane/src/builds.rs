//! Node builds: the `dataplane` binaries nodes may run. The installed one is what this
//! control plane starts nodes with (the local provider) or serves to a cloud node's first boot
//! (`GET /v1/nodes/{id}/dataplane`); the operator publishes others (`POST /v1/builds`), which
//! a rollout (`rollout.rs`) then has nodes fetch (`GET /v1/nodes/{id}/builds/SHA256`).
//!
//! A published build's file is kept in `DATA_DIR/builds/SHA256` of the replica it was
//! published to, its record in the store. With several replicas, publish it to each (a node
//! asking one that lacks the file is answered 503 and asks the next).

use crate::config::Config;
pub use crate::model::build::Build;
use crate::store::{Store, StoreError};
use qe_shared::node_channel::DesiredBuild;
use sha2::Digest;
use std::path::{Path, PathBuf};

#[derive(Debug, thiserror::Error)]
pub enum BuildError {
    #[error("{0}")]
    NotABuild(String),
    #[error("a build is at most {0} bytes")]
    TooLarge(u64),
    #[error("the upload ended early: {0}")]
    Cut(String),
    #[error("the build {0} is published, but its file is on another replica")]
    Elsewhere(String),
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("{0}")]
    Io(String),
}

/// The builds this replica holds.
pub struct Builds {
    dir: PathBuf,
    /// The installed build's file.
    installed: PathBuf,
    /// Its hash and size, read once when first asked for (it is tens of megabytes).
    installed_build: tokio::sync::OnceCell<Option<DesiredBuild>>,
}

impl Builds {
    pub fn new(config: &Config) -> Builds {
        let served = config.served_dataplane();
        let installed = match served.exists() {
            true => served,
            false => config.dataplane_binary(),
        };
        Builds {
            dir: config.data_dir.join("builds"),
            installed,
            installed_build: tokio::sync::OnceCell::new(),
        }
    }

    /// The build nodes start from (None if its file cannot be read).
    pub async fn installed(&self) -> Option<DesiredBuild> {
        let path = self.installed.clone();
        let read = || async move {
            let hashed = tokio::task::spawn_blocking(move || hash_file(&path)).await;
            match hashed {
                Ok(Ok((binary_sha256, size))) => Some(DesiredBuild {
                    binary_sha256,
                    size,
                }),
                _ => None,
            }
        };
        self.installed_build.get_or_init(read).await.clone()
    }

    /// Build `sha256` as a node is told of it: the installed one or a published one.
    pub async fn desired(
        &self,
        store: &Store,
        sha256: &str,
    ) -> Result<Option<DesiredBuild>, StoreError> {
        if let Some(installed) = self.installed().await {
            if installed.binary_sha256 == sha256 {
                return Ok(Some(installed));
            }
        }
        Ok(store.build(sha256).await?.map(|build| build.desired()))
    }

    /// The file of build `sha256` on this replica; `None` if no such build is known.
    pub async fn file(&self, store: &Store, sha256: &str) -> Result<Option<PathBuf>, BuildError> {
        if !qe_shared::build::is_sha256(sha256) {
            return Ok(None);
        }
        if self.installed().await.map(|b| b.binary_sha256).as_deref() == Some(sha256) {
            return Ok(Some(self.installed.clone()));
        }
        if store.build(sha256).await?.is_none() {
            return Ok(None);
        }
        let path = self.dir.join(sha256);
        match path.exists() {
            true => Ok(Some(path)),
            false => Err(BuildError::Elsewhere(sha256.to_string())),
        }
    }

    /// Publishes the binary in `body` (streamed to a file beside the builds, hashed on the
    /// way): checked to be an ELF binary of a CPU nodes run on, kept under its hash, recorded.
    pub async fn publish(
        &self,
        store: &Store,
        body: axum::body::Body,
        label: Option<String>,
        at_most: u64,
    ) -> Result<Build, BuildError> {
        use futures::StreamExt;
        use tokio::io::AsyncWriteExt;
        let io = |e: std::io::Error| BuildError::Io(e.to_string());
        tokio::fs::create_dir_all(&self.dir).await.map_err(io)?;
        let nonce = qe_shared::hex(&qe_shared::random::bytes::<8>());
        let partial = Partial(self.dir.join(format!("upload-{nonce}")));
        let mut file = tokio::fs::File::create(&partial.0).await.map_err(io)?;
        let mut hasher = sha2::Sha256::new();
        let mut size = 0u64;
        let mut head = Vec::new();
        let mut stream = body.into_data_stream();
        let copied: Result<(), BuildError> = async {
            while let Some(chunk) = stream.next().await {
                let chunk = chunk.map_err(|e| BuildError::Cut(e.to_string()))?;
                size += chunk.len() as u64;
                if size > at_most {
                    return Err(BuildError::TooLarge(at_most));
                }
                if head.len() < 20 {
                    head.extend_from_slice(&chunk[..chunk.len().min(20 - head.len())]);
                }
                hasher.update(&chunk);
                file.write_all(&chunk).await.map_err(io)?;
            }
            file.sync_all().await.map_err(io)?;
            Ok(())
        }
        .await;
        let architecture = copied.and_then(|()| {
            qe_shared::build::architecture(&head)
                .map(str::to_string)
                .map_err(|why| BuildError::NotABuild(format!("not a build: {why}")))
        });
        // Refused or cut off, the partial file goes with `partial` (dropped).
        let architecture = architecture?;
        let sha256 = qe_shared::hex(&hasher.finalize());
        tokio::fs::rename(&partial.0, self.dir.join(&sha256))
            .await
            .map_err(io)?;
        let build = Build {
            sha256,
            size,
            architecture,
            label,
            published: crate::unix_now(),
        };
        store.put_build(&build).await?;
        Ok(build)
    }
}

/// An upload's file until it is a build: removed if the upload stops short (refused, cut off,
/// or its request dropped when the client went away).
struct Partial(PathBuf);

impl Drop for Partial {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// SHA-256 (hex) and size of the file at `path`.
fn hash_file(path: &Path) -> std::io::Result<(String, u64)> {
    let bytes = std::fs::read(path)?;
    Ok((
        qe_shared::hex(&sha2::Sha256::digest(&bytes)),
        bytes.len() as u64,
    ))
}

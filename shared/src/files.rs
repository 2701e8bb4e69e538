//! Files written whole or not at all: the one way both planes write what must survive a
//! crash (credentials, keys, kept configs, secrets).

use std::path::Path;

/// Runs `work`, which waits on the disk, without holding up the runtime's other tasks: on a
/// multi-threaded runtime its worker first hands them to another thread (`block_in_place`),
/// so a disk that stalls delays this work only, never the connections, the API or its health
/// checks. Elsewhere (a test's single-threaded runtime, or no runtime) it just runs.
pub fn on_disk<T>(work: impl FnOnce() -> T) -> T {
    use tokio::runtime::{Handle, RuntimeFlavor};
    match Handle::try_current().map(|runtime| runtime.runtime_flavor()) {
        Ok(RuntimeFlavor::MultiThread) => tokio::task::block_in_place(work),
        _ => work(),
    }
}

/// Writes `path` whole or not at all, readable by its owner alone: see [`write_whole`]. Every
/// credential, private key and secret is written so.
pub fn write_private(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    write_whole(path, bytes, 0o600)
}

/// Writes `path` whole or not at all, with permissions `mode`: to a file beside it
/// (`PATH` with the extension `new`), synced, renamed over it, and the rename synced too (its
/// directory), so that a crash leaves the old file or the new one, never a part, and what
/// is then used (a rotated credential, a new key) outlasts a power loss.
///
/// Its two syncs wait on the disk, so it runs through [`on_disk`]: a node keeping a config or
/// a rotated credential while its disk stalls goes on serving its connections meanwhile.
pub fn write_whole(path: &Path, bytes: &[u8], mode: u32) -> std::io::Result<()> {
    on_disk(|| write_whole_waiting(path, bytes, mode))
}

/// [`write_whole`] on the calling thread.
fn write_whole_waiting(path: &Path, bytes: &[u8], mode: u32) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let side = path.with_extension("new");
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(mode)
        .open(&side)?;
    // A side file left by a crash keeps its old permissions: set them again.
    file.set_permissions(std::os::unix::fs::PermissionsExt::from_mode(mode))?;
    file.write_all(bytes)?;
    file.sync_all()?;
    std::fs::rename(side, path)?;
    sync_dir(path)
}

/// Syncs the directory holding `path`, so that a file just linked or renamed into it stays.
pub fn sync_dir(path: &Path) -> std::io::Result<()> {
    let dir = match path.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir,
        _ => Path::new("."),
    };
    std::fs::File::open(dir)?.sync_all()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn a_private_file_is_its_owners_alone_and_replaces_the_old_one_whole() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("key.pem");
        std::fs::write(&path, "old").unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        write_private(&path, b"new").unwrap();
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "new");
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        assert!(
            !dir.path().join("key.new").exists(),
            "nothing left beside it"
        );
    }
}

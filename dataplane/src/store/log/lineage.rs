//! Which log this is: a random id given to a log when its directory is first opened, kept in
//! its `lineage` file, and sent to its standby before anything else, which keeps it in its
//! copy. A node started on a standby's copy (a promotion) carries the same log on, so its
//! former primary, back as its standby, may have its divergent tail cut. A node whose data
//! was lost starts a new lineage, and a standby that holds a log of another lineage is never
//! told to cut or remove it (`replication::primary`): it may hold the only copy of every
//! acknowledged message.

use std::path::Path;

/// The file in the log's directory.
pub const FILE: &str = "lineage";

/// The lineage of the log in `dir`, if it has one.
pub fn of(dir: &Path) -> std::io::Result<Option<String>> {
    match std::fs::read_to_string(dir.join(FILE)) {
        Ok(text) => Ok(Some(text.trim().to_string())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e),
    }
}

/// The lineage of the log in `dir`, a new one given (synced) if it has none: a new log, or
/// one from before lineages.
pub fn ensure(dir: &Path) -> std::io::Result<String> {
    if let Some(lineage) = of(dir)? {
        return Ok(lineage);
    }
    let lineage = qe_shared::hex(&qe_shared::random::bytes::<16>());
    keep(dir, &lineage)?;
    Ok(lineage)
}

/// Keeps `lineage` as the log's in `dir` (a standby taking its primary's), synced.
pub fn keep(dir: &Path, lineage: &str) -> std::io::Result<()> {
    qe_shared::files::write_whole(&dir.join(FILE), lineage.as_bytes(), 0o644)
}

//! The queue's epoch, as one copy of its log knows it: the control plane moves it on each time
//! a standby's copy is promoted, so that a former primary that comes back (or never went: a
//! partition) cannot take writes beside its successor.
//!
//! Kept in the log's directory (`epoch`), with the copy, so a promoted copy carries it on:
//! - a primary serves at the highest epoch it has kept or been given, and tells its standby;
//! - a standby keeps the highest it has followed, and never follows a primary of a lower one
//!   than that or than it was given;
//! - a primary that hears of a higher one from a standby (one that followed a primary of that
//!   epoch, reaching this one by a name that has not moved yet) has been superseded: it keeps
//!   that (synced) and stops, and it never starts as a primary on that copy again. The copy
//!   may still follow the new primary as its standby, which cuts its tail that was never
//!   synced on two disks.
//! - a primary given a higher one in its config takes it: the control plane gives its config
//!   only to the queue's node (the local provider runs one per queue; a promoted copy may
//!   start before its new epoch is stored).

use std::path::Path;

/// The file in the log's directory: `N`, or `N superseded-by M`.
pub const FILE: &str = "epoch";

/// What a copy keeps of the epochs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Kept {
    /// The highest epoch this copy has served at or followed; 0: none kept.
    pub epoch: u64,
    /// A primary of this copy heard of this higher epoch and stopped.
    pub superseded_by: Option<u64>,
}

impl Kept {
    /// The lowest epoch a primary this copy follows may be at: a former primary's copy
    /// follows none below the epoch that superseded it.
    pub fn floor(&self) -> u64 {
        self.epoch.max(self.superseded_by.unwrap_or(0))
    }
}

#[derive(Debug, thiserror::Error)]
pub enum EpochError {
    #[error("the epoch file: {0}")]
    Disk(#[from] std::io::Error),
    #[error("the epoch file says {0:?}: not an epoch")]
    Unreadable(String),
    #[error("this copy's primary was superseded at epoch {epoch} by epoch {by}: it does not serve as a primary again (run it as the new primary's standby, or remove its data)")]
    Superseded { epoch: u64, by: u64 },
}

/// What the log in `dir` keeps; nothing kept reads as epoch 0.
pub fn kept(dir: &Path) -> Result<Kept, EpochError> {
    let text = match std::fs::read_to_string(dir.join(FILE)) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Kept::default()),
        Err(e) => return Err(e.into()),
    };
    parse(&text).ok_or_else(|| EpochError::Unreadable(text.trim().to_string()))
}

fn parse(text: &str) -> Option<Kept> {
    let mut words = text.split_whitespace();
    let epoch = words.next()?.parse().ok()?;
    let superseded_by = match (words.next(), words.next()) {
        (None, _) => None,
        (Some("superseded-by"), Some(by)) => Some(by.parse().ok()?),
        _ => return None,
    };
    match words.next() {
        None => Some(Kept {
            epoch,
            superseded_by,
        }),
        Some(_) => None,
    }
}

/// Keeps `kept` in `dir`, synced.
fn keep(dir: &Path, kept: Kept) -> Result<(), EpochError> {
    let text = match kept.superseded_by {
        Some(by) => format!("{} superseded-by {by}\n", kept.epoch),
        None => format!("{}\n", kept.epoch),
    };
    qe_shared::files::write_whole(&dir.join(FILE), text.as_bytes(), 0o644)?;
    Ok(())
}

/// Refuses a copy whose primary was superseded: it never serves as a primary again, with a
/// standby or without (a node that only hands its last records over may open it).
pub fn refuse_superseded(dir: &Path) -> Result<(), EpochError> {
    let kept = kept(dir)?;
    match kept.superseded_by {
        Some(by) => Err(EpochError::Superseded {
            epoch: kept.epoch,
            by,
        }),
        None => Ok(()),
    }
}

/// The epoch a primary starts at on the log in `dir`: the higher of what it keeps and what it
/// was `given` (kept, if higher). A superseded copy keeps its mark and its epoch: serving
/// nodes have refused it before ([`refuse_superseded`]).
pub fn start_primary(dir: &Path, given: Option<u64>) -> Result<u64, EpochError> {
    let kept = kept(dir)?;
    if kept.superseded_by.is_some() {
        // Opened only to hand its last records over: its epoch stays what it was, so the
        // copy may still rejoin the primary that superseded it.
        return Ok(kept.epoch);
    }
    let epoch = kept.epoch.max(given.unwrap_or(0));
    if epoch > kept.epoch {
        keep(dir, Kept { epoch, ..kept })?;
    }
    Ok(epoch)
}

/// A primary given a higher `epoch` while it serves: kept.
pub fn raise(dir: &Path, epoch: u64) -> Result<(), EpochError> {
    keep(
        dir,
        Kept {
            epoch,
            superseded_by: None,
        },
    )
}

/// A primary at `epoch` heard of `by`: kept, so that it never starts as a primary again.
pub fn supersede(dir: &Path, epoch: u64, by: u64) -> Result<(), EpochError> {
    keep(
        dir,
        Kept {
            epoch,
            superseded_by: Some(by),
        },
    )
}

/// A standby follows a primary at `epoch`, higher than `kept`'s: kept in `dir`. A former
/// primary's mark stays until its copy has caught up ([`caught_up`]): until then it may hold
/// a tail the new primary never had.
pub fn follow(dir: &Path, kept: &mut Kept, epoch: u64) -> Result<(), EpochError> {
    let following = Kept { epoch, ..*kept };
    keep(dir, following)?;
    *kept = following;
    Ok(())
}

/// A standby's copy caught up with its primary: a former primary's mark goes.
pub fn caught_up(dir: &Path, kept: &mut Kept) -> Result<(), EpochError> {
    if kept.superseded_by.is_some() {
        let cleared = Kept {
            superseded_by: None,
            ..*kept
        };
        keep(dir, cleared)?;
        *kept = cleared;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_primary_takes_the_higher_epoch_and_a_superseded_copy_never_serves_again() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(kept(dir.path()).unwrap(), Kept::default());
        assert_eq!(start_primary(dir.path(), None).unwrap(), 0);
        assert_eq!(start_primary(dir.path(), Some(3)).unwrap(), 3);
        // What it kept wins over a lower epoch given (a control plane restored from an old
        // backup, say).
        assert_eq!(start_primary(dir.path(), Some(2)).unwrap(), 3);
        supersede(dir.path(), 3, 4).unwrap();
        let refused = refuse_superseded(dir.path());
        assert!(matches!(
            refused,
            Err(EpochError::Superseded { epoch: 3, by: 4 })
        ));
        // Opened all the same (to hand its last records over), it keeps the mark and its
        // epoch, whatever it is given.
        assert_eq!(start_primary(dir.path(), Some(7)).unwrap(), 3);
        assert_eq!(kept(dir.path()).unwrap().floor(), 4);
        assert!(refuse_superseded(dir.path()).is_err());
        // As the new primary's standby it may follow; the mark goes once it has caught up.
        let mut standby = kept(dir.path()).unwrap();
        assert_eq!(standby.epoch, 3);
        assert_eq!(
            standby.floor(),
            4,
            "no primary below the one that superseded it"
        );
        follow(dir.path(), &mut standby, 4).unwrap();
        assert!(refuse_superseded(dir.path()).is_err());
        caught_up(dir.path(), &mut standby).unwrap();
        refuse_superseded(dir.path()).unwrap();
        assert_eq!(start_primary(dir.path(), None).unwrap(), 4);
    }

    #[test]
    fn what_is_not_an_epoch_file_is_an_error_never_epoch_0() {
        for bad in [
            "",
            "x",
            "3 superseded-by",
            "3 superseded-by x",
            "3 4",
            "3 superseded-by 4 5",
        ] {
            assert_eq!(parse(bad), None, "{bad:?}");
        }
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join(FILE), "3 4").unwrap();
        assert!(matches!(kept(dir.path()), Err(EpochError::Unreadable(_))));
        assert!(start_primary(dir.path(), Some(5)).is_err());
        assert!(refuse_superseded(dir.path()).is_err());
    }
}

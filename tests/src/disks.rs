//! File systems that fail on purpose, for the storage-fault tests (they need root, as CI has):
//! - [`FailingSyncs`]: a FUSE pass-through (`tests/faults/faultfs.py`) whose syncs fail with
//!   EIO on command while writes still work: a disk the kernel could not write back to.
//! - [`SmallTmpfs`]: a tmpfs of a few MiB that a filler file fills on command: a full disk.
//! - [`Ext4Image`]: ext4 on a loop device, mounted `errors=remount-ro`, which ext4's own
//!   error path makes read-only on command; then checked with e2fsck and mounted again.
//!
//! Each is unmounted (and its loop device detached) when dropped.

use crate::{python, workspace, PROMPT};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

/// Runs a command; panics with its output unless it succeeds.
fn run(program: &str, args: &[&str]) -> String {
    let output = Command::new(program)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("{program}: {e} (./scripts/test installs it)"));
    let text = String::from_utf8_lossy(&output.stdout).to_string();
    assert!(
        output.status.success(),
        "{program} {args:?} failed: {text}{}",
        String::from_utf8_lossy(&output.stderr)
    );
    text
}

fn path_str(path: &Path) -> &str {
    path.to_str().expect("a UTF-8 path")
}

/// Whether `dir` is a mount point now.
fn is_mounted(dir: &Path) -> bool {
    let mounts = std::fs::read_to_string("/proc/self/mounts").unwrap();
    mounts
        .lines()
        .any(|line| line.split_whitespace().nth(1) == Some(path_str(dir)))
}

/// Waits until `dir` is a mount point, as the mounting process makes it one: the kernel
/// signals every change of the mount table to a poll on `/proc/self/mounts`.
fn wait_until_mounted(dir: &Path, mounter: &mut Child) {
    use std::os::fd::AsRawFd;
    let table = std::fs::File::open("/proc/self/mounts").unwrap();
    let deadline = std::time::Instant::now() + PROMPT;
    while !is_mounted(dir) {
        if let Ok(Some(status)) = mounter.try_wait() {
            panic!("the file system exited before it was mounted: {status}");
        }
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        assert!(!left.is_zero(), "never mounted");
        let mut change = libc::pollfd {
            fd: table.as_raw_fd(),
            events: libc::POLLPRI,
            revents: 0,
        };
        // SAFETY: one valid pollfd for an open file.
        unsafe { libc::poll(&mut change, 1, left.as_millis().min(100) as i32) };
    }
}

/// A node's data directory whose message log sits on `dir`, and beside it, on the ordinary
/// disk, the directory its small settings store (sled) uses: only the log meets the faults.
/// Keep both for the node's life.
pub fn data_dir_on(dir: &Path) -> (tempfile::TempDir, tempfile::TempDir) {
    let data = tempfile::tempdir_in(dir).unwrap();
    let meta = tempfile::tempdir().unwrap();
    std::os::unix::fs::symlink(meta.path(), data.path().join("meta")).unwrap();
    (data, meta)
}

/// A FUSE pass-through whose syncs fail, or stall, on command.
pub struct FailingSyncs {
    daemon: Child,
    mount: PathBuf,
    control: PathBuf,
    /// A message per write or sync that began to wait while the disk is held.
    held: std::sync::mpsc::Receiver<()>,
    _dirs: tempfile::TempDir,
}

impl FailingSyncs {
    pub fn mount() -> FailingSyncs {
        let dirs = tempfile::tempdir().unwrap();
        let (backing, mount) = (dirs.path().join("backing"), dirs.path().join("mount"));
        std::fs::create_dir(&backing).unwrap();
        std::fs::create_dir(&mount).unwrap();
        let control = dirs.path().join("control");
        let script = workspace().join("tests/faults/faultfs.py");
        let mut daemon = Command::new(python())
            .arg(script)
            .args([&backing, &mount, &control])
            .stdout(Stdio::piped())
            .spawn()
            .expect("start faultfs.py");
        let (held_tx, held) = std::sync::mpsc::channel();
        let stdout = std::io::BufReader::new(daemon.stdout.take().unwrap());
        std::thread::spawn(move || {
            use std::io::BufRead;
            for line in stdout.lines().map_while(Result::ok) {
                if line == "held" && held_tx.send(()).is_err() {
                    return;
                }
            }
        });
        wait_until_mounted(&mount, &mut daemon);
        FailingSyncs {
            daemon,
            mount,
            control,
            held,
            _dirs: dirs,
        }
    }

    pub fn dir(&self) -> &Path {
        &self.mount
    }

    /// Every sync from now on fails with EIO.
    pub fn fail_syncs(&self) {
        std::fs::write(&self.control, "fail").unwrap();
    }

    /// Every write and sync from now on waits, until the guard is dropped: a stalled disk.
    /// Keep the guard after whatever uses the disk, so that a test that fails heals the disk
    /// before it stops that (a process waiting on a held disk cannot even be killed).
    pub fn hold(&self) -> Held<'_> {
        std::fs::write(&self.control, "hold").unwrap();
        Held(self)
    }

    /// Waits until a write or sync is being held.
    pub fn wait_for_held(&self) {
        self.held
            .recv_timeout(PROMPT)
            .expect("a write or sync began while the disk is held");
    }

    /// Syncs work again.
    pub fn heal(&self) {
        std::fs::write(&self.control, "ok").unwrap();
    }
}

impl Drop for FailingSyncs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.mount).status();
        let _ = self.daemon.kill();
        let _ = self.daemon.wait();
    }
}

/// The disk is held until this is dropped ([`FailingSyncs::hold`]).
pub struct Held<'a>(&'a FailingSyncs);

impl Drop for Held<'_> {
    fn drop(&mut self) {
        self.0.heal();
    }
}

/// A tmpfs of a few MiB.
pub struct SmallTmpfs {
    mount: tempfile::TempDir,
}

impl SmallTmpfs {
    pub fn mount(mib: u64) -> SmallTmpfs {
        let mount = tempfile::tempdir().unwrap();
        let size = format!("size={mib}m");
        run(
            "mount",
            &["-t", "tmpfs", "-o", &size, "tmpfs", path_str(mount.path())],
        );
        SmallTmpfs { mount }
    }

    pub fn dir(&self) -> &Path {
        self.mount.path()
    }

    /// Fills what is left with a file, to the last byte the file system gives.
    pub fn fill(&self) {
        let mut filler = std::fs::File::create(self.filler()).unwrap();
        let block = vec![0xA5u8; 64 << 10];
        loop {
            if let Err(error) = std::io::Write::write_all(&mut filler, &block) {
                assert_eq!(error.raw_os_error(), Some(libc::ENOSPC), "{error}");
                break;
            }
        }
        // Smaller writes take what a whole block did not.
        while std::io::Write::write_all(&mut filler, &[0xA5]).is_ok() {}
    }

    /// Gives the room back.
    pub fn empty(&self) {
        std::fs::remove_file(self.filler()).unwrap();
    }

    fn filler(&self) -> PathBuf {
        self.dir().join("filler")
    }
}

impl Drop for SmallTmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(self.mount.path()).status();
    }
}

/// ext4 on a loop device, mounted so that an error makes it read-only.
pub struct Ext4Image {
    device: String,
    mount: PathBuf,
    _dirs: tempfile::TempDir,
}

impl Ext4Image {
    pub fn new(mib: u64) -> Ext4Image {
        let dirs = tempfile::tempdir().unwrap();
        let image = dirs.path().join("disk.img");
        let mount = dirs.path().join("mount");
        std::fs::create_dir(&mount).unwrap();
        let file = std::fs::File::create(&image).unwrap();
        file.set_len(mib << 20).unwrap();
        let device = run("losetup", &["--find", "--show", path_str(&image)])
            .trim()
            .to_string();
        run("mkfs.ext4", &["-q", "-F", &device]);
        let disk = Ext4Image {
            device,
            mount,
            _dirs: dirs,
        };
        disk.mount_it();
        disk
    }

    fn mount_it(&self) {
        let device = &self.device;
        run(
            "mount",
            &["-o", "errors=remount-ro", device, path_str(&self.mount)],
        );
    }

    pub fn dir(&self) -> &Path {
        &self.mount
    }

    /// Makes ext4 meet an error of its own: with `errors=remount-ro` it goes read-only at
    /// once, open files and all.
    pub fn go_read_only(&self) {
        let name = Path::new(&self.device).file_name().unwrap();
        let trigger = Path::new("/sys/fs/ext4")
            .join(name)
            .join("trigger_fs_error");
        std::fs::write(trigger, "a test makes this disk read-only").unwrap();
        let mounts = std::fs::read_to_string("/proc/self/mounts").unwrap();
        let line = mounts
            .lines()
            .find(|l| l.split_whitespace().nth(1) == Some(path_str(&self.mount)))
            .expect("mounted");
        // Newer kernels keep `rw` and add `emergency_ro`.
        let options = line.split_whitespace().nth(3).unwrap();
        let read_only = |o: &str| o == "ro" || o == "emergency_ro";
        assert!(options.split(',').any(read_only), "{line}");
    }

    /// Unmounts, repairs with e2fsck and mounts again, writable.
    pub fn repair(&self) {
        run("umount", &[path_str(&self.mount)]);
        // e2fsck exits 1 when it fixed something: that is a success here.
        let status = Command::new("e2fsck")
            .args(["-f", "-y", &self.device])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .unwrap();
        assert!(matches!(status.code(), Some(0..=1)), "e2fsck: {status}");
        self.mount_it();
    }
}

impl Drop for Ext4Image {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.mount).status();
        let _ = Command::new("losetup")
            .args(["--detach", &self.device])
            .status();
    }
}

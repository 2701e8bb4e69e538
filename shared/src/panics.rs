//! What a panic does in a serving process: it ends the process.

/// Makes every panic, on any thread, end the process once it is reported, in every build.
///
/// A panic must not leave a half-changed queue or control plane serving: a task's panic would
/// otherwise be caught by the runtime and the rest of the process would carry on beside the
/// state it left. Release builds abort on panic by their profile already. Debug builds unwind
/// (`cargo test` builds every dependency with unwinding, so a `panic = "abort"` dev profile
/// had every dependency compiled twice, once for the binaries and once for the tests), and the
/// binaries the tests start get the same end from this hook.
pub fn abort_on_panic() {
    let report = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |panic| {
        report(panic);
        std::process::abort();
    }));
}

#[cfg(test)]
mod tests {
    use std::os::unix::process::ExitStatusExt;

    const NAME: &str = "panics::tests::a_panic_on_another_thread_ends_the_whole_process";

    /// Runs itself again as a child process (the hook is the whole process's): there a thread
    /// panics, and the main thread must never carry on past it.
    #[test]
    fn a_panic_on_another_thread_ends_the_whole_process() {
        if std::env::var_os("QE_PANICS_CHILD").is_some() {
            super::abort_on_panic();
            let _ = std::thread::spawn(|| panic!("a task's panic")).join();
            println!("carried on");
            return;
        }
        let child = std::process::Command::new(std::env::current_exe().unwrap())
            .args(["--exact", NAME, "--nocapture", "--test-threads=1"])
            .env("QE_PANICS_CHILD", "1")
            .output()
            .unwrap();
        let (stdout, stderr) = (
            String::from_utf8_lossy(&child.stdout),
            String::from_utf8_lossy(&child.stderr),
        );
        const SIGABRT: i32 = 6;
        assert_eq!(child.status.signal(), Some(SIGABRT), "{stdout}\n{stderr}");
        assert!(!stdout.contains("carried on"), "{stdout}");
        assert!(
            stderr.contains("a task's panic"),
            "the panic is reported: {stderr}"
        );
    }
}

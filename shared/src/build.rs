//! Node builds (`dataplane` binaries), as both sides check them: the control plane when one is
//! published, the node before it runs one.

/// Whether `text` names a build: a SHA-256 in lowercase hex.
pub fn is_sha256(text: &str) -> bool {
    text.len() == 64 && text.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

/// The CPU an ELF binary starting with `head` (its first 20 bytes will do) is built for, as
/// Rust names it (`std::env::consts::ARCH`), among those nodes run on.
pub fn architecture(head: &[u8]) -> Result<&'static str, String> {
    if head.get(..4) != Some(b"\x7fELF".as_slice()) {
        return Err("it is not an ELF binary (the dataplane program)".into());
    }
    match head.get(18..20).map(|m| u16::from_le_bytes([m[0], m[1]])) {
        Some(0x3e) => Ok("x86_64"),
        Some(0xb7) => Ok("aarch64"),
        machine => Err(format!(
            "it is built for neither x86_64 nor aarch64 (ELF machine {machine:?})"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_build_is_an_elf_binary_of_a_cpu_nodes_run_on() {
        let own = std::fs::read(std::env::current_exe().unwrap()).unwrap();
        assert_eq!(architecture(&own[..20]), Ok(std::env::consts::ARCH));
        assert!(architecture(b"#!/bin/sh\nexec true\n").is_err());
        let mut sparc = own[..20].to_vec();
        sparc[18] = 0x02;
        sparc[19] = 0;
        assert!(architecture(&sparc).unwrap_err().contains("ELF machine"));
        let mut arm = own[..20].to_vec();
        arm[18..20].copy_from_slice(&0xb7u16.to_le_bytes());
        assert_eq!(architecture(&arm), Ok("aarch64"));
    }

    #[test]
    fn a_build_is_named_by_its_sha256_in_lowercase_hex() {
        assert!(is_sha256(&"a1".repeat(32)));
        assert!(!is_sha256(&"A1".repeat(32)));
        assert!(!is_sha256(&"a1".repeat(31)));
        assert!(!is_sha256("../../etc/passwd"));
    }
}

//! A cloud node's user data: the cloud-init template of `infra/cloud-init/node.yaml`
//! (built in, or the operator's own file) with the node's bootstrap and volume filled in. The
//! template's `{{name}}` placeholders are all it knows; one left over is refused up front.

use base64::Engine;
use qe_shared::node_channel::Bootstrap;
use sha2::Digest;
use std::path::Path;

/// The template as this build ships it.
pub const BUILT_IN: &str = include_str!("../../../infra/cloud-init/node.yaml");

/// What the instance's node is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Serving its queue.
    Serve,
    /// Only handing over the records its volume holds that were never reported (its queue
    /// was deleted while its node could not report), then powering the instance off.
    ReportLast,
}

impl Mode {
    fn name(self) -> &'static str {
        match self {
            Mode::Serve => "serve",
            Mode::ReportLast => "report-last",
        }
    }
}

pub struct NodeBoot {
    template: String,
    /// SHA-256 (hex) of the `dataplane` binary the control plane serves nodes: the first-boot
    /// script installs only that one.
    dataplane_sha256: String,
}

impl NodeBoot {
    /// `template` with `dataplane` as the binary nodes install; refused if the template has a
    /// placeholder this does not fill. The binary as read now is kept at `served` (what
    /// `GET /v1/nodes/{id}/dataplane` sends), so the hash nodes check is always the one of the
    /// file they get, even after a new `dataplane` is installed beside a running control plane.
    pub fn new(template: String, dataplane: &Path, served: &Path) -> Result<NodeBoot, String> {
        let binary =
            std::fs::read(dataplane).map_err(|e| format!("{}: {e}", dataplane.display()))?;
        let dataplane_sha256 = qe_shared::hex(&sha2::Sha256::digest(&binary));
        crate::write_private(served, &binary).map_err(|e| format!("{}: {e}", served.display()))?;
        let boot = NodeBoot {
            template,
            dataplane_sha256,
        };
        let sample = Bootstrap {
            control_plane: "https://cp".into(),
            control_planes: vec![],
            queue_id: "q".into(),
            node_token: "t".into(),
            bootstrap_token: Some("1.00".into()),
            control_plane_ca_pem: None,
        };
        let rendered = boot.render(&sample, "vol-0", Mode::Serve);
        match rendered.find("{{") {
            Some(at) => {
                let rest: String = rendered[at..].chars().take(40).collect();
                Err(format!(
                    "the cloud-init template has a placeholder nobody fills: {rest}"
                ))
            }
            None => Ok(boot),
        }
    }

    /// The user data of the node that starts from `bootstrap`, with the queue's data on
    /// `volume_id`, to run as `mode` says. It carries the bootstrap's one-time bootstrap
    /// token, never its node token: user data can be read back through EC2's API
    /// (`api/bootstrap.rs`).
    pub fn render(&self, bootstrap: &Bootstrap, volume_id: &str, mode: Mode) -> String {
        let one_time = Bootstrap {
            node_token: String::new(),
            ..bootstrap.clone()
        };
        let bootstrap_toml = toml::to_string(&one_time).expect("plain fields");
        let bootstrap_b64 = base64::engine::general_purpose::STANDARD.encode(bootstrap_toml);
        let template = without_comments(&self.template);
        [
            ("queue_id", bootstrap.queue_id.as_str()),
            ("control_plane", bootstrap.control_plane.as_str()),
            ("bootstrap_b64", bootstrap_b64.as_str()),
            ("dataplane_sha256", self.dataplane_sha256.as_str()),
            ("volume_id", volume_id),
            ("mode", mode.name()),
        ]
        .iter()
        .fold(template, |text, (name, value)| {
            text.replace(&format!("{{{{{name}}}}}"), value)
        })
    }

    pub fn dataplane_sha256(&self) -> &str {
        &self.dataplane_sha256
    }
}

/// `template` without its comment lines (`#` or `# …` after any indentation: the YAML's and
/// the script's), which are for readers of the template: EC2 takes at most 16 KB of user
/// data. `#cloud-config` and a script's `#!` line stay.
fn without_comments(template: &str) -> String {
    let comment = |line: &&str| {
        let text = line.trim_start();
        text == "#" || text.starts_with("# ")
    };
    let kept: Vec<&str> = template.lines().filter(|line| !comment(line)).collect();
    kept.join("\n") + "\n"
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_built_in_template_is_filled_whole_with_the_nodes_bootstrap() {
        let binary = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(binary.path(), b"a node").unwrap();
        let dir = tempfile::tempdir().unwrap();
        let served = dir.path().join("dataplane-served");
        let boot = NodeBoot::new(BUILT_IN.to_string(), binary.path(), &served).unwrap();
        // What nodes download is what the hash was taken of, whatever happens to the file.
        std::fs::write(binary.path(), b"a newer node").unwrap();
        assert_eq!(std::fs::read(&served).unwrap(), b"a node");
        let bootstrap = Bootstrap {
            control_plane: "https://cp.example:8443".into(),
            control_planes: vec![
                "https://cp.example:8443".into(),
                "https://cp2.example:8443".into(),
            ],
            queue_id: "k3j9x0c2m1ab".into(),
            node_token: "0123abcd".into(),
            bootstrap_token: Some("1700000000000.abcd".into()),
            control_plane_ca_pem: Some(
                "-----BEGIN CERTIFICATE-----\nAA==\n-----END CERTIFICATE-----\n".into(),
            ),
        };
        let text = boot.render(&bootstrap, "vol-0abc", Mode::Serve);
        assert!(!text.contains("{{"), "every placeholder filled");
        assert!(text.contains("MODE='serve'"));
        let last = boot.render(&bootstrap, "vol-0abc", Mode::ReportLast);
        assert!(last.contains("MODE='report-last'"));
        assert!(text.starts_with("#cloud-config\n"));
        assert!(
            !text.contains("# --- The node token"),
            "comments are not sent"
        );
        assert!(text.contains("#!/bin/bash\n"));
        assert!(text.contains("QUEUE_ID='k3j9x0c2m1ab'"));
        assert!(text.contains("VOLUME_ID='vol-0abc'"));
        assert!(text.contains(&format!(
            "DATAPLANE_SHA256='{}'",
            qe_shared::hex(&sha2::Sha256::digest(b"a node"))
        )));
        let encoded = text
            .lines()
            .find_map(|line| line.trim().strip_prefix("content: \""))
            .unwrap()
            .trim_end_matches('"');
        let decoded = base64::engine::general_purpose::STANDARD
            .decode(encoded)
            .unwrap();
        let read: Bootstrap = toml::from_str(std::str::from_utf8(&decoded).unwrap()).unwrap();
        // Everything but the node token, which user data never carries.
        assert!(read.node_token.is_empty());
        assert!(!text.contains("0123abcd"));
        let expected = Bootstrap {
            node_token: String::new(),
            ..bootstrap
        };
        assert_eq!(read, expected);
        // A template with a placeholder nobody fills is refused before any node gets it.
        let odd = format!("{BUILT_IN}\nbootcmd: [\"{{{{nobody}}}}\"]\n");
        assert!(NodeBoot::new(odd, binary.path(), &served).is_err());
    }
}

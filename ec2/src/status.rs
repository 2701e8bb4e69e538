//! Whether EC2 is mending an instance itself: a silent node on an instance that reboots, is
//! recovered onto other hardware, or is under scheduled maintenance comes back on its own,
//! with its volume, sooner than a replacement would boot. The control plane waits for it
//! (once, for a bounded time) instead of terminating it.

use aws_sdk_ec2::types as sdk;

use crate::{Ec2, Ec2Error};

/// Event codes of work EC2 does to an instance that it comes back from. A retirement or a
/// stop does not: the instance is gone after it.
const MENDING_EVENTS: [&str; 3] = ["instance-reboot", "system-reboot", "system-maintenance"];

/// What `DescribeInstanceStatus` says of one instance, read down to what the decision needs.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct InstanceHealth {
    /// `pending`, `running`, `stopping` ...
    pub state: String,
    /// The system (host) and instance status checks: `ok`, `impaired`, `initializing`,
    /// `insufficient-data`, `not-applicable`.
    pub system_check: String,
    pub instance_check: String,
    /// Its scheduled events: the code, the description (`[Completed]` or `[Canceled]` once
    /// over) and when it starts, in seconds since 1970.
    pub events: Vec<(String, String, Option<i64>)>,
}

impl InstanceHealth {
    /// Whether EC2 is bringing the instance back by itself at `now_secs`: it is starting
    /// (booting, rebooting, recovered onto a new host), its checks are still initializing
    /// after such a start, or a reboot or maintenance event of its is under way.
    pub fn recovering(&self, now_secs: i64) -> bool {
        let initializing = |check: &str| check == "initializing";
        let mending = self.events.iter().any(|(code, description, starts)| {
            let over =
                description.starts_with("[Completed]") || description.starts_with("[Canceled]");
            let started = starts.is_none_or(|starts| starts <= now_secs);
            MENDING_EVENTS.contains(&code.as_str()) && started && !over
        });
        let live = matches!(self.state.as_str(), "pending" | "running");
        self.state == "pending"
            || (live && (initializing(&self.system_check) || initializing(&self.instance_check)))
            || (live && mending)
    }

    fn from_sdk(status: &sdk::InstanceStatus) -> InstanceHealth {
        let check = |summary: Option<&sdk::InstanceStatusSummary>| {
            let status = summary.and_then(|summary| summary.status());
            status.map_or("", |status| status.as_str()).to_string()
        };
        let events = status
            .events()
            .iter()
            .map(|event| {
                let code = event.code().map_or("", |code| code.as_str()).to_string();
                let description = event.description().unwrap_or_default().to_string();
                (code, description, event.not_before().map(|at| at.secs()))
            })
            .collect();
        InstanceHealth {
            state: status
                .instance_state()
                .and_then(|state| state.name())
                .map_or("", |name| name.as_str())
                .to_string(),
            system_check: check(status.system_status()),
            instance_check: check(status.instance_status()),
            events,
        }
    }
}

impl Ec2 {
    /// What EC2 says of instance `id`'s health; `None` when it does not know it.
    pub async fn health(&self, region: &str, id: &str) -> Result<Option<InstanceHealth>, Ec2Error> {
        let reply = self
            .client(region)?
            .describe_instance_status()
            .instance_ids(id)
            .include_all_instances(true)
            .send()
            .await;
        let reply = match reply.map_err(Ec2Error::sdk("DescribeInstanceStatus")) {
            Err(err) if err.code() == Some("InvalidInstanceID.NotFound") => return Ok(None),
            other => other?,
        };
        Ok(reply
            .instance_statuses()
            .first()
            .map(InstanceHealth::from_sdk))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn health(state: &str, system: &str, instance: &str) -> InstanceHealth {
        InstanceHealth {
            state: state.into(),
            system_check: system.into(),
            instance_check: instance.into(),
            events: Vec::new(),
        }
    }

    const NOW: i64 = 1_800_000_000;

    #[test]
    fn a_healthy_or_impaired_running_instance_is_not_recovering() {
        assert!(!health("running", "ok", "ok").recovering(NOW));
        // Impaired with nothing under way: EC2 is not mending it, so it is replaced.
        assert!(!health("running", "impaired", "impaired").recovering(NOW));
        assert!(!health("stopped", "not-applicable", "not-applicable").recovering(NOW));
    }

    #[test]
    fn a_starting_instance_or_one_whose_checks_initialize_is_recovering() {
        assert!(health("pending", "", "").recovering(NOW));
        assert!(health("running", "initializing", "ok").recovering(NOW));
        assert!(health("running", "ok", "initializing").recovering(NOW));
        assert!(!health("stopping", "initializing", "initializing").recovering(NOW));
    }

    #[test]
    fn a_reboot_or_maintenance_under_way_is_recovering_until_it_is_over() {
        let with = |code: &str, description: &str, starts: i64| InstanceHealth {
            events: vec![(code.into(), description.into(), Some(starts))],
            ..health("running", "impaired", "impaired")
        };
        assert!(with("system-reboot", "scheduled reboot", NOW - 60).recovering(NOW));
        assert!(with("system-maintenance", "power maintenance", NOW).recovering(NOW));
        assert!(!with("system-reboot", "scheduled reboot", NOW + 3600).recovering(NOW));
        assert!(!with("system-reboot", "[Completed] reboot", NOW - 60).recovering(NOW));
        assert!(!with("instance-reboot", "[Canceled] reboot", NOW - 60).recovering(NOW));
        // A retirement or a stop does not bring it back.
        assert!(!with("instance-retirement", "retiring", NOW - 60).recovering(NOW));
        assert!(!with("instance-stop", "stopping", NOW - 60).recovering(NOW));
    }

    #[test]
    fn the_sdk_answer_is_read() {
        let summary = |status| sdk::InstanceStatusSummary::builder().status(status).build();
        let event = sdk::InstanceStatusEvent::builder()
            .code(sdk::EventCode::SystemReboot)
            .description("scheduled reboot")
            .not_before(aws_sdk_ec2::primitives::DateTime::from_secs(NOW - 10))
            .build();
        let status = sdk::InstanceStatus::builder()
            .instance_state(
                sdk::InstanceState::builder()
                    .name(sdk::InstanceStateName::Running)
                    .build(),
            )
            .system_status(summary(sdk::SummaryStatus::Impaired))
            .instance_status(summary(sdk::SummaryStatus::Ok))
            .events(event)
            .build();
        let health = InstanceHealth::from_sdk(&status);
        assert_eq!(health.state, "running");
        assert_eq!(health.system_check, "impaired");
        assert_eq!(health.instance_check, "ok");
        assert_eq!(
            health.events,
            [(
                "system-reboot".into(),
                "scheduled reboot".into(),
                Some(NOW - 10)
            )]
        );
        assert!(health.recovering(NOW));
    }
}

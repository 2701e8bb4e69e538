//! One error type for the whole crate. AWS's refusals keep their code, because that is what a caller decides on
//! (`InsufficientInstanceCapacity` means try elsewhere, `RequestLimitExceeded` means wait); calls that got no
//! answer are a separate variant, because they may have taken effect.

use std::error::Error;

use aws_sdk_ec2::error::{DisplayErrorContext, ProvideErrorMetadata, SdkError};

#[derive(Debug, thiserror::Error)]
pub enum Ec2Error {
    /// The region is not in the settings, so there is no subnet or image to use there.
    #[error("region {0} is not configured")]
    NoSuchRegion(String),
    /// A standby was asked for in a region whose settings name no standby subnet.
    #[error("region {region} has no standby subnet (another zone's) configured")]
    NoStandbySubnet { region: String },
    /// AWS answered with an error.
    #[error("{operation}: {code}: {message}")]
    Api {
        operation: &'static str,
        code: String,
        message: String,
    },
    /// No answer came (connection, timeout, unreadable response): the call may or may not have taken effect, so
    /// retry only what is idempotent (a launch is, through its client token).
    #[error("{operation}: no answer: {message}")]
    Unanswered {
        operation: &'static str,
        message: String,
    },
    /// AWS answered without something it always sends; nothing was understood, so nothing is assumed.
    #[error("{operation}: the answer has no {field}")]
    Incomplete {
        operation: &'static str,
        field: &'static str,
    },
    /// EC2 refuses user data over 16 KiB before encoding; refusing here says why instead of a generic
    /// parameter error.
    #[error("user data is {0} bytes, EC2 takes at most 16384")]
    UserDataTooLarge(usize),
    /// The volume is not known to EC2 in that region, or belongs to another cluster.
    #[error("volume {0} does not exist in this cluster")]
    NoSuchVolume(String),
    /// A volume attaches to one instance at a time; the other one must be gone (or detached) first.
    #[error("volume {volume} is attached to {instance}")]
    AttachedElsewhere { volume: String, instance: String },
    /// A volume did not reach `available` in time (still creating, or still detaching).
    #[error("volume {volume} is not available: {message}")]
    NotAvailable { volume: String, message: String },
}

impl Ec2Error {
    /// AWS's error code (`InvalidInstanceID.NotFound`, …) when AWS refused.
    pub fn code(&self) -> Option<&str> {
        match self {
            Ec2Error::Api { code, .. } => Some(code),
            _ => None,
        }
    }

    /// Whether trying again can never mend it: AWS refused the request itself (a parameter,
    /// an image, a subnet or group that does not exist, an instance type the region or image
    /// does not run), or it was refused here before it was sent. Throttling, capacity and
    /// quotas pass, and an unanswered call may have worked.
    pub fn mends_nothing(&self) -> bool {
        const FOR_GOOD: [&str; 4] = [
            "InvalidParameter",
            "Unsupported",
            "InvalidAMIID.",
            "InvalidInstanceType",
        ];
        const NOT_FOUND: [&str; 3] = [
            "InvalidSubnetID.NotFound",
            "InvalidGroup.NotFound",
            "InvalidKeyPair.NotFound",
        ];
        match self {
            Ec2Error::NoSuchRegion(_)
            | Ec2Error::NoStandbySubnet { .. }
            | Ec2Error::UserDataTooLarge(_) => true,
            Ec2Error::Api {
                operation: "RunInstances",
                code,
                ..
            } => {
                FOR_GOOD.iter().any(|prefix| code.starts_with(prefix))
                    || NOT_FOUND.contains(&code.as_str())
            }
            _ => false,
        }
    }

    /// Converts an SDK error from `operation`; use as `.map_err(Ec2Error::sdk("RunInstances"))`.
    pub(crate) fn sdk<E, R>(operation: &'static str) -> impl FnOnce(SdkError<E, R>) -> Ec2Error
    where
        E: ProvideErrorMetadata + Error + 'static,
        R: std::fmt::Debug,
    {
        move |err| match err.code() {
            Some(code) => Ec2Error::Api {
                operation,
                code: code.to_owned(),
                message: err.message().unwrap_or_default().to_owned(),
            },
            None => Ec2Error::Unanswered {
                operation,
                message: DisplayErrorContext(&err).to_string(),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refused(operation: &'static str, code: &str) -> Ec2Error {
        Ec2Error::Api {
            operation,
            code: code.into(),
            message: String::new(),
        }
    }

    #[test]
    fn a_launch_refused_for_its_parameters_mends_nothing_and_throttling_does() {
        for code in [
            "InvalidParameterValue",
            "InvalidParameterCombination",
            "Unsupported",
            "InvalidAMIID.NotFound",
            "InvalidSubnetID.NotFound",
            "InvalidInstanceType.NotFound",
        ] {
            assert!(refused("RunInstances", code).mends_nothing(), "{code}");
        }
        for code in [
            "RequestLimitExceeded",
            "InsufficientInstanceCapacity",
            "VcpuLimitExceeded",
            "InternalError",
        ] {
            assert!(!refused("RunInstances", code).mends_nothing(), "{code}");
        }
        // Only a launch's own refusal: a volume's parameter error is another matter.
        assert!(!refused("AttachVolume", "InvalidParameterValue").mends_nothing());
        assert!(Ec2Error::UserDataTooLarge(20_000).mends_nothing());
        let unanswered = Ec2Error::Unanswered {
            operation: "RunInstances",
            message: "timeout".into(),
        };
        assert!(!unanswered.mends_nothing());
    }
}

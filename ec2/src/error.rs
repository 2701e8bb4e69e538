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

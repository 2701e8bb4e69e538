//! One error type for the whole library: what the queue refused (with the manual's failure
//! code), what the client refused before sending, and what happened to the connection.

use crate::id::MessageId;
use qe_shared::Code;

/// What can go wrong. Every fallible call of this crate returns it.
///
/// Branch on [`Error::code`] for the queue's answers: the manual's codes never change, while
/// reasons are for people.
///
/// ```
/// use qe_client::{Code, Error};
///
/// fn retry_later(error: &Error) -> bool {
///     matches!(error.code(), Some(Code::MessageCountExceeded | Code::MessageMemoryExceeded))
///         || error.is_transient()
/// }
/// # assert!(retry_later(&Error::Refused { code: Code::MessageCountExceeded,
/// #     reason: "Max allowed message count exceeded.".into(), id: None }));
/// ```
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The queue refused the request: `{"status":"Failure.","code":..,"reason":..}`.
    ///
    /// For 506 and 507 the change **was made** (only its durability is in doubt): do not send
    /// it again. A 507 to a publish, ack or admin change carries the message's `id`.
    #[error("the queue refused: {} {reason}", code.number())]
    Refused {
        /// The manual's failure code.
        code: Code,
        /// The queue's text, for people (its words can change).
        reason: String,
        /// The message the reply names, when it names one (a 507 does).
        id: Option<MessageId>,
    },
    /// The client refused the request before sending it: the queue would have answered with
    /// `code`. Nothing was sent, and the connection is untouched.
    #[error("not sent: {} {reason}", code.number())]
    Invalid {
        /// The code the queue would have answered with.
        code: Code,
        /// Why, for people.
        reason: String,
    },
    /// A frame would be bigger than the connection's limit: the queue's `max-ws-msg-len`
    /// learned at its login (65536 bytes unless an administrator changed it), or the one the
    /// [`Endpoint`](crate::Endpoint) fixed ([`FrameLimit`](crate::FrameLimit)). The queue
    /// would have closed the connection with 1009. Nothing was sent, and the connection is
    /// untouched.
    #[error("a frame of {bytes} bytes is over the limit of {limit}")]
    TooLarge {
        /// The frame's size, JSON included.
        bytes: usize,
        /// The limit.
        limit: usize,
    },
    /// The connection ended. A request that was in flight may or may not have taken effect:
    /// a publish may have been published (at least once: use the message id to find
    /// duplicates), an ack may have counted.
    #[error("the connection closed ({}): {reason}", close_code.map_or("no close frame".to_string(), |c| c.to_string()))]
    Closed {
        /// The WebSocket close code the queue sent (1000 after a logout, 1009 for a frame too
        /// big, ...); `None` when the connection ended without a close frame (other clients
        /// report 1006), as after a failed login or a network failure.
        close_code: Option<u16>,
        /// What ended it, for people.
        reason: String,
    },
    /// The connection could not be made: address, DNS, TCP, TLS or the WebSocket upgrade.
    #[error("could not connect to {url}: {reason}")]
    Connect {
        /// Where to.
        url: String,
        /// What failed.
        reason: String,
    },
    /// No answer in time: the connection and login (see
    /// [`Endpoint::connect_timeout`](crate::Endpoint::connect_timeout)), or a control plane's
    /// request (see [`ControlPlane::builder`](crate::ControlPlane::builder)).
    #[error("timed out after {} s", .0.as_secs_f64())]
    Timeout(std::time::Duration),
    /// The subscriber's session ended while the connection was down and could not be resumed:
    /// the delivery being acknowledged belongs to it, so the ack was not sent. The queue
    /// delivers the message again, to this subscriber or another.
    #[error("the session that received this message has ended; it will be delivered again")]
    SessionEnded,
    /// The queue sent something this library does not understand.
    #[error("unexpected frame from the queue: {0}")]
    Protocol(String),
    /// A body is not the JSON asked for, or a value could not be written as JSON.
    #[error("JSON: {0}")]
    Json(String),
    /// The control plane answered with an error: `{"error":{"code":..,"message":..}}`.
    #[error("the control plane answered {status} {code}: {message}")]
    Api {
        /// The HTTP status.
        status: u16,
        /// The stable error code (`not_found`, `limit_reached`, ...).
        code: String,
        /// Its message, for people.
        message: String,
    },
    /// An HTTP request to the control plane failed before any answer.
    #[error("HTTP: {0}")]
    Http(String),
}

impl Error {
    /// The manual's failure code: the queue's, or the one a request refused before sending
    /// would have got.
    pub fn code(&self) -> Option<Code> {
        match self {
            Error::Refused { code, .. } | Error::Invalid { code, .. } => Some(*code),
            _ => None,
        }
    }

    /// Whether trying again later is sensible as it is: the connection failed or closed, or
    /// the queue had a problem of its own (the 500s, except 505–507: 505 changed nothing but
    /// is about the settings store, and 506/507 made the change already).
    pub fn is_transient(&self) -> bool {
        match self {
            Error::Refused { code, .. } => {
                (500..=504).contains(&code.number())
                    || matches!(
                        code,
                        Code::MessageCountExceeded | Code::MessageMemoryExceeded
                    )
            }
            Error::Closed { .. } | Error::Connect { .. } | Error::Timeout(_) => true,
            Error::Http(_) => true,
            Error::Api { status, .. } => *status >= 500 || *status == 429,
            _ => false,
        }
    }

    pub(crate) fn invalid(code: Code) -> Error {
        Error::Invalid {
            code,
            reason: code.reason().to_string(),
        }
    }

    pub(crate) fn invalid_because(code: Code, reason: impl Into<String>) -> Error {
        Error::Invalid {
            code,
            reason: reason.into(),
        }
    }

    pub(crate) fn protocol(what: impl std::fmt::Display) -> Error {
        Error::Protocol(what.to_string())
    }
}

impl From<serde_json::Error> for Error {
    fn from(error: serde_json::Error) -> Error {
        Error::Json(error.to_string())
    }
}

/// This crate's result.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// The code with this number, if the manual (or the README's additions to it) has one.
pub(crate) fn code_of(number: u64) -> Option<Code> {
    Code::ALL
        .into_iter()
        .chain(Code::BEYOND_MANUAL)
        .find(|code| u64::from(code.number()) == number)
}

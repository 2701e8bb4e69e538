//! What can go wrong, as the exit code a script can branch on.

use qe_client::Error;
use std::fmt;

/// The exit codes, as `qe --help` lists them.
pub const EXIT_CODES: &str = "\
Exit codes:
  0  done
  1  usage: bad arguments, no such profile or login, a config file that does not read
  2  not found: no such queue, message or setting (the API's 404, the queue's 301)
  3  refused by the queue or the API: a failure code (the manual's code is printed:
     `refused: 414 …`), a message over the queue's max-ws-msg-len (refused before it
     is sent: `refused: a frame of N bytes is over the limit of L`), or the queue
     closing the connection over what was sent (1002, 1003, 1007, 1008, 1009:
     `refused: closed 1009 …`)
  4  cannot reach or hear from the queue or the API: no connection, a timeout
     (`timed out after N s`), a 5xx or 503, the queue's 500–504, or a connection that
     ended without the queue refusing anything (no close frame, 1001, 1011–1013)
  5  unauthorized: a bad token or key (401, 403), or a login the queue refuses (107)";

/// A failure, with the exit code it ends `qe` with.
#[derive(Debug)]
pub enum Failure {
    /// Bad arguments, a missing profile or login: exit 1.
    Usage(String),
    /// No such queue, message, setting: exit 2.
    NotFound(String),
    /// The queue or the API said no; `code` is the manual's, when the queue gave one: exit 3.
    Refused {
        /// The manual's failure code.
        code: Option<u16>,
        /// What was refused.
        message: String,
    },
    /// Could not connect, or the other side is unavailable: exit 4.
    Unavailable(String),
    /// The token or login was not accepted: exit 5.
    Unauthorized(String),
}

impl Failure {
    /// The process's exit code.
    pub fn exit_code(&self) -> u8 {
        match self {
            Failure::Usage(_) => 1,
            Failure::NotFound(_) => 2,
            Failure::Refused { .. } => 3,
            Failure::Unavailable(_) => 4,
            Failure::Unauthorized(_) => 5,
        }
    }

    /// A refusal with the manual's code.
    pub fn refused(code: u16, message: impl Into<String>) -> Failure {
        Failure::Refused {
            code: Some(code),
            message: message.into(),
        }
    }
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Failure::Usage(message) => write!(f, "error: {message}"),
            Failure::NotFound(message) => write!(f, "not found: {message}"),
            Failure::Refused {
                code: Some(code),
                message,
            } => write!(f, "refused: {code} {message}"),
            Failure::Refused {
                code: None,
                message,
            } => write!(f, "refused: {message}"),
            Failure::Unavailable(message) => write!(f, "unavailable: {message}"),
            Failure::Unauthorized(message) => write!(f, "unauthorized: {message}"),
        }
    }
}

impl From<Error> for Failure {
    fn from(error: Error) -> Failure {
        use qe_client::Code;
        match &error {
            Error::Refused { code, reason, .. } | Error::Invalid { code, reason } => match code {
                Code::AuthenticationFailed => Failure::Unauthorized(format!(
                    "{} {reason} (the saved login is not the queue's: `qe queues login` or \
                     `qe logins rotate`)",
                    code.number()
                )),
                Code::InvalidMessageId => Failure::NotFound(format!("{} {reason}", code.number())),
                _ if (500..=504).contains(&code.number()) => {
                    Failure::Unavailable(format!("{} {reason}", code.number()))
                }
                _ => Failure::refused(code.number(), reason.clone()),
            },
            Error::Api { status, .. } => match status {
                404 => Failure::NotFound(error.to_string()),
                401 | 403 => Failure::Unauthorized(error.to_string()),
                500.. => Failure::Unavailable(error.to_string()),
                _ => Failure::Refused {
                    code: None,
                    message: error.to_string(),
                },
            },
            Error::Closed {
                close_code: Some(code @ (1002 | 1003 | 1007 | 1008 | 1009)),
                reason,
            } => Failure::Refused {
                code: None,
                message: format!("closed {code} by the queue: {reason}"),
            },
            Error::Connect { .. } | Error::Timeout(_) | Error::Closed { .. } | Error::Http(_) => {
                Failure::Unavailable(error.to_string())
            }
            _ => Failure::Refused {
                code: None,
                message: error.to_string(),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The exit code of each kind of client error, as the table in `EXIT_CODES` says.
    #[test]
    fn each_error_has_the_exit_code_of_its_row() {
        let closed = |close_code: Option<u16>| Error::Closed {
            close_code,
            reason: "why".into(),
        };
        let exit = |error: Error| Failure::from(error).exit_code();
        for code in [1002, 1003, 1007, 1008, 1009] {
            assert_eq!(exit(closed(Some(code))), 3, "closed {code}");
        }
        for code in [None, Some(1001), Some(1011), Some(1013)] {
            assert_eq!(exit(closed(code)), 4, "closed {code:?}");
        }
        let too_large = Error::TooLarge {
            bytes: 2000,
            limit: 1024,
        };
        assert_eq!(exit(too_large), 3, "over the queue's max-ws-msg-len");
        let timeout = Error::Timeout(std::time::Duration::from_secs(5));
        assert_eq!(exit(timeout), 4);
    }
}

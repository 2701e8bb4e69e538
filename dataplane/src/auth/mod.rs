//! Who may use the queue: its three logins, one per role (passwords kept only as hashes,
//! [`PasswordHash`], shared with the control plane, and compared in constant time); the SQS
//! face's access keys ([`SqsKey`]); and the web console's short-lived logins ([`console`]).

pub mod console;

pub use qe_shared::password::PasswordHash;
use qe_shared::protocol::Role;
use subtle::ConstantTimeEq;

/// One role's login.
#[derive(Debug, Clone)]
pub struct Login {
    pub username: String,
    pub password: PasswordHash,
}

/// The queue's three logins.
#[derive(Debug, Clone)]
pub struct Logins {
    pub publisher: Login,
    pub subscriber: Login,
    pub admin: Login,
}

impl Logins {
    /// Whether `username` and `password` are `role`'s login. Both are always checked, so the
    /// time taken does not tell which one was wrong.
    pub fn verify(&self, role: Role, username: &str, password: &str) -> bool {
        let login = match role {
            Role::Publisher => &self.publisher,
            Role::Subscriber => &self.subscriber,
            Role::Admin => &self.admin,
        };
        let name_matches = username.as_bytes().ct_eq(login.username.as_bytes());
        let password_matches = subtle::Choice::from(login.password.matches(password) as u8);
        (name_matches & password_matches).into()
    }
}

/// An SQS access key of this queue: what signs requests, and the role it acts as.
#[derive(Clone, PartialEq, Eq)]
pub struct SqsKey {
    pub access_key_id: String,
    pub secret: String,
    pub role: Role,
}

impl std::fmt::Debug for SqsKey {
    /// Never the secret.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "SqsKey({} as {:?})", self.access_key_id, self.role)
    }
}

impl SqsKey {
    /// Reads `ROLE:ACCESS_KEY_ID:SECRET` (the `--sqs-key` flag).
    pub fn parse(text: &str) -> Option<SqsKey> {
        let (role, rest) = text.split_once(':')?;
        let (access_key_id, secret) = rest.split_once(':')?;
        SqsKey::new(role, access_key_id, secret)
    }

    /// A key of the role named `role`, if each part is one: an id of 1 to 128 letters and
    /// digits, a secret not empty.
    pub fn new(role: &str, access_key_id: &str, secret: &str) -> Option<SqsKey> {
        let valid_id = !access_key_id.is_empty()
            && access_key_id.len() <= 128
            && access_key_id.bytes().all(|b| b.is_ascii_alphanumeric());
        let role = Role::parse(role)?;
        (valid_id && !secret.is_empty()).then(|| SqsKey {
            access_key_id: access_key_id.to_string(),
            secret: secret.to_string(),
            role,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn login(name: &str, password: &str) -> Login {
        Login {
            username: name.into(),
            password: PasswordHash::new(password),
        }
    }

    #[test]
    fn each_role_has_its_own_login() {
        let logins = Logins {
            publisher: login("pub", "p-secret"),
            subscriber: login("sub", "s-secret"),
            admin: login("adm", "a-secret"),
        };
        assert!(logins.verify(Role::Publisher, "pub", "p-secret"));
        assert!(logins.verify(Role::Subscriber, "sub", "s-secret"));
        assert!(logins.verify(Role::Admin, "adm", "a-secret"));
        assert!(!logins.verify(Role::Subscriber, "pub", "p-secret"));
        assert!(!logins.verify(Role::Publisher, "pub", "p-secret2"));
        assert!(!logins.verify(Role::Publisher, "pu", "p-secret"));
        assert!(!logins.verify(Role::Publisher, "", ""));
    }
}

//! The queue's three logins, one per role. Passwords are kept only as hashes
//! ([`PasswordHash`], shared with the control plane) and compared in constant time.

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

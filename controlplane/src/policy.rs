//! Which instance types, in which regions, a new queue may ask for: the operator's rules
//! (`[[allow]]` in the config), per tier and per account. Without rules, whatever the provider
//! can run; with them, only what a rule for the queue's tier and account allows: a key of an
//! account cannot launch an instance type nobody meant it to have.

use crate::model::queue::{NewQueue, Tier};
use serde::Deserialize;

/// One `[[allow]]` rule: these instance types, in these regions, for queues of this tier and
/// account. Rules add up: a queue may have what any rule that applies to it allows.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Allow {
    /// The tier it applies to. Default: every tier.
    pub tier: Option<Tier>,
    /// The account it applies to. Default: every account, and queues of none.
    pub account: Option<String>,
    pub instance_types: Vec<String>,
    /// Default: every region the provider runs queues in.
    #[serde(default)]
    pub regions: Vec<String>,
}

impl Allow {
    fn applies_to(&self, new: &NewQueue) -> bool {
        let tier = self.tier.is_none_or(|tier| tier == new.tier);
        let account = self.account.is_none() || self.account == new.account;
        tier && account
    }

    fn allows(&self, new: &NewQueue) -> bool {
        let region = self.regions.is_empty() || self.regions.contains(&new.region);
        region && self.instance_types.contains(&new.instance_type)
    }

    /// `t4g.small, t4g.medium` or `t4g.small (eu-west-1, us-east-2)`.
    fn describe(&self) -> String {
        let types = self.instance_types.join(", ");
        match self.regions.is_empty() {
            true => types,
            false => format!("{types} ({})", self.regions.join(", ")),
        }
    }
}

/// Whether `rules` let `new` be made; the refusal names what they allow it instead.
pub fn check(rules: &[Allow], new: &NewQueue) -> Result<(), String> {
    if rules.is_empty() {
        return Ok(());
    }
    let applying: Vec<&Allow> = rules.iter().filter(|rule| rule.applies_to(new)).collect();
    if applying.iter().any(|rule| rule.allows(new)) {
        return Ok(());
    }
    let allowed: Vec<String> = applying.iter().map(|rule| rule.describe()).collect();
    let tier = serde_json::to_value(new.tier).expect("a plain enum");
    let whose = match &new.account {
        Some(account) => format!(" of account {account}"),
        None => String::new(),
    };
    Err(format!(
        "instance type {:?} in region {:?} is not allowed for a {} queue{whose}; allowed: {}",
        new.instance_type,
        new.region,
        tier.as_str().unwrap_or_default(),
        match allowed.is_empty() {
            true => "nothing".to_string(),
            false => allowed.join("; "),
        }
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn new(tier: Tier, account: Option<&str>, region: &str, instance_type: &str) -> NewQueue {
        NewQueue {
            tier,
            region: region.into(),
            instance_type: instance_type.into(),
            ipv4: false,
            account: account.map(str::to_string),
            ..Default::default()
        }
    }

    fn rules() -> Vec<Allow> {
        toml::from_str::<std::collections::BTreeMap<String, Vec<Allow>>>(
            r#"
            [[allow]]
            instance_types = ["t4g.micro", "t4g.small"]
            [[allow]]
            tier = "standard"
            instance_types = ["t4g.medium"]
            regions = ["eu-west-1"]
            [[allow]]
            account = "big"
            instance_types = ["m7g.xlarge"]
            "#,
        )
        .unwrap()
        .remove("allow")
        .unwrap()
    }

    #[test]
    fn no_rules_allow_everything() {
        assert!(check(&[], &new(Tier::Standard, None, "x", "r8g.48xlarge")).is_ok());
    }

    #[test]
    fn a_queue_has_what_any_rule_for_its_tier_and_account_allows() {
        let rules = rules();
        let ok = |n: NewQueue| check(&rules, &n).is_ok();
        assert!(ok(new(Tier::Devtest, None, "us-east-2", "t4g.micro")));
        assert!(ok(new(
            Tier::Standard,
            Some("a"),
            "eu-west-1",
            "t4g.medium"
        )));
        assert!(!ok(new(Tier::Standard, None, "us-east-2", "t4g.medium")));
        assert!(!ok(new(Tier::Devtest, None, "eu-west-1", "t4g.medium")));
        assert!(ok(new(
            Tier::Devtest,
            Some("big"),
            "us-east-2",
            "m7g.xlarge"
        )));
        assert!(!ok(new(
            Tier::Devtest,
            Some("small"),
            "us-east-2",
            "m7g.xlarge"
        )));
        assert!(!ok(new(Tier::Standard, None, "eu-west-1", "r8g.48xlarge")));
    }

    #[test]
    fn a_refusal_lists_what_is_allowed() {
        let refused = check(
            &rules(),
            &new(Tier::Standard, Some("a"), "eu-west-1", "r8g.48xlarge"),
        );
        assert_eq!(
            refused.unwrap_err(),
            "instance type \"r8g.48xlarge\" in region \"eu-west-1\" is not allowed for a standard \
             queue of account a; allowed: t4g.micro, t4g.small; t4g.medium (eu-west-1)"
        );
    }
}

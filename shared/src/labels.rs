//! The labels a queue is placed and billed under (`region`, `instance_type`): a lowercase
//! letter or digit, then up to 62 of lowercase letters, digits, `.` and `-` — every cloud's
//! region and instance-type names fit (`eu-west-1`, `t4g.small`), and nothing in them can
//! break a record, a CSV row, a log line or a DNS label.

/// The pattern, as the docs and error messages show it.
pub const LABEL_PATTERN: &str = "[a-z0-9][a-z0-9.-]{0,62}";

const LONGEST: usize = 63;

/// Whether `value` fits [`LABEL_PATTERN`].
pub fn is_label(value: &str) -> bool {
    let bytes = value.as_bytes();
    let allowed = |b: &u8| b.is_ascii_lowercase() || b.is_ascii_digit();
    match bytes.split_first() {
        Some((first, rest)) => {
            bytes.len() <= LONGEST
                && allowed(first)
                && rest.iter().all(|b| allowed(b) || *b == b'.' || *b == b'-')
        }
        None => false,
    }
}

/// `Ok` if `value` fits, else why not, naming the field.
pub fn check(field: &str, value: &str) -> Result<(), String> {
    match is_label(value) {
        true => Ok(()),
        false => Err(format!(
            "{field} {value:?} is not a label: it must match {LABEL_PATTERN}"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cloud_names_fit_and_nothing_that_could_break_a_record_does() {
        for good in [
            "local",
            "eu-west-1",
            "t4g.small",
            "m5.2xlarge",
            "a",
            &"a".repeat(63),
        ] {
            assert!(is_label(good), "{good}");
        }
        for bad in [
            "",
            "eu,west-1",
            "Eu-west-1",
            "-eu",
            ".eu",
            "eu west",
            "eu\"west",
            "eu\nwest",
            "eu_west",
            "é",
            &"a".repeat(64),
        ] {
            assert!(!is_label(bad), "{bad:?}");
        }
        assert!(check("region", "eu,west-1")
            .unwrap_err()
            .contains(LABEL_PATTERN));
    }
}

//! Which statuses count as an HTTP job's success ([`ExpectStatus`]).

use std::str::FromStr;

/// Most items in an `expect_status` list.
const EXPECT_STATUS_ITEMS_MAX: usize = 16;

/// The statuses that count as success: `2xx`, `200`, `200-299`, or a comma-separated list
/// of these (`2xx,304`). The default is `2xx`.
///
/// ```
/// let s: solocron::ExpectStatus = "2xx, 304".parse().unwrap();
/// assert!(s.matches(204) && s.matches(304) && !s.matches(302));
/// assert_eq!(s.to_string(), "2xx,304");
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExpectStatus {
    /// Inclusive ranges, with the text each was written as.
    items: Vec<(u16, u16, String)>,
}

impl ExpectStatus {
    /// True if `status` is one of the expected statuses.
    pub fn matches(&self, status: u16) -> bool {
        self.items.iter().any(|(lo, hi, _)| (*lo..=*hi).contains(&status))
    }
}

impl Default for ExpectStatus {
    fn default() -> ExpectStatus {
        ExpectStatus { items: vec![(200, 299, "2xx".to_owned())] }
    }
}

impl std::fmt::Display for ExpectStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let texts: Vec<&str> = self.items.iter().map(|(_, _, t)| t.as_str()).collect();
        f.write_str(&texts.join(","))
    }
}

impl FromStr for ExpectStatus {
    type Err = String;

    fn from_str(s: &str) -> Result<ExpectStatus, String> {
        let how = "write 200, 2xx, 200-299, or a comma-separated list of these such as 2xx,304";
        let parts: Vec<&str> = s.split(',').map(str::trim).collect();
        if parts.len() > EXPECT_STATUS_ITEMS_MAX {
            return Err(format!("has {} items; at most {EXPECT_STATUS_ITEMS_MAX}", parts.len()));
        }
        let mut items = Vec::with_capacity(parts.len());
        for part in parts {
            let Some((lo, hi)) = status_item(part) else {
                let shown: String = part.chars().take(40).collect();
                return Err(format!("`{shown}` is not a status (100 to 599) or a range of them: {how}"));
            };
            if lo > hi {
                return Err(format!("`{part}` runs from high to low: write {hi}-{lo}"));
            }
            items.push((lo, hi, part.to_ascii_lowercase()));
        }
        Ok(ExpectStatus { items })
    }
}

/// One item of an `expect_status` list as an inclusive range: `2xx`, `200`, `200-299`.
fn status_item(item: &str) -> Option<(u16, u16)> {
    let code = |s: &str| -> Option<u16> {
        let n: u16 = s.parse().ok().filter(|_| s.len() == 3 && s.bytes().all(|b| b.is_ascii_digit()))?;
        (100..=599).contains(&n).then_some(n)
    };
    if let Some(class) = item.strip_suffix("xx").or_else(|| item.strip_suffix("XX")) {
        let c = code(&format!("{class}00"))?;
        return Some((c, c + 99));
    }
    match item.split_once('-') {
        Some((lo, hi)) => Some((code(lo.trim())?, code(hi.trim())?)),
        None => code(item).map(|c| (c, c)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expect_status_reads_classes_codes_ranges_and_lists_and_refuses_the_rest() {
        let s: ExpectStatus = " 2XX , 304, 400 - 404 ".parse().unwrap();
        assert_eq!(s.to_string(), "2xx,304,400 - 404");
        for (status, expected) in [(200, true), (299, true), (304, true), (402, true), (300, false), (405, false)] {
            assert_eq!(s.matches(status), expected, "{status}");
        }
        assert!(ExpectStatus::default().matches(204) && !ExpectStatus::default().matches(301));
        for bad in ["", "2xx,", "6xx", "0xx", "20x", "2000", "099", "600", "+200", "200-", "abc"] {
            assert!(bad.parse::<ExpectStatus>().is_err(), "{bad:?} accepted");
        }
        let many = vec!["200"; EXPECT_STATUS_ITEMS_MAX + 1].join(",");
        assert!(many.parse::<ExpectStatus>().unwrap_err().contains("at most 16"));
    }
}

//! Which type a plain scalar reads as, by the rules of the YAML library kpt
//! uses: a string that would read back as another type must be quoted.

/// The tag a plain scalar resolves to: `!!null`, `!!bool`, `!!int`,
/// `!!float`, `!!timestamp`, `!!merge` or `!!str`.
pub fn resolve_plain(value: &str) -> &'static str {
    match value {
        "" | "~" | "null" | "Null" | "NULL" => return "!!null",
        "true" | "True" | "TRUE" | "false" | "False" | "FALSE" => return "!!bool",
        ".inf" | ".Inf" | ".INF" | "+.inf" | "+.Inf" | "+.INF" | "-.inf" | "-.Inf" | "-.INF"
        | ".nan" | ".NaN" | ".NAN" => return "!!float",
        "<<" => return "!!merge",
        _ => {}
    }
    let first = value.as_bytes()[0];
    if !(first.is_ascii_digit() || matches!(first, b'+' | b'-' | b'.')) {
        return "!!str";
    }
    if is_timestamp(value) {
        return "!!timestamp";
    }
    let plain = value.replace('_', "");
    if is_go_int(&plain) {
        return "!!int";
    }
    if is_yaml_float(&plain) {
        return "!!float";
    }
    let unsigned = plain.strip_prefix('-').unwrap_or(&plain);
    if let Some(bin) = unsigned.strip_prefix("0b")
        && !bin.is_empty()
        && bin.bytes().all(|b| matches!(b, b'0' | b'1'))
    {
        return "!!int";
    }
    if let Some(oct) = unsigned.strip_prefix("0o")
        && !oct.is_empty()
        && oct.bytes().all(|b| (b'0'..=b'7').contains(&b))
    {
        return "!!int";
    }
    "!!str"
}

/// `strconv.ParseInt(s, 0, 64)` syntax (sign, 0x/0o/0b prefixes, leading-0
/// octal), without the range check.
fn is_go_int(s: &str) -> bool {
    let s = s.strip_prefix(['+', '-']).unwrap_or(s);
    if s.is_empty() {
        return false;
    }
    let (digits, radix) = if let Some(r) = s.strip_prefix("0x").or(s.strip_prefix("0X")) {
        (r, 16)
    } else if let Some(r) = s.strip_prefix("0o").or(s.strip_prefix("0O")) {
        (r, 8)
    } else if let Some(r) = s.strip_prefix("0b").or(s.strip_prefix("0B")) {
        (r, 2)
    } else if s.len() > 1 && s.starts_with('0') {
        (&s[1..], 8)
    } else {
        (s, 10)
    };
    !digits.is_empty() && digits.chars().all(|c| c.is_digit(radix))
}

/// `^[-+]?(\.[0-9]+|[0-9]+(\.[0-9]*)?)([eE][-+]?[0-9]+)?$`
fn is_yaml_float(s: &str) -> bool {
    let b = s.as_bytes();
    let mut i = 0;
    if i < b.len() && matches!(b[i], b'+' | b'-') {
        i += 1;
    }
    let digits = |i: &mut usize| {
        let start = *i;
        while *i < b.len() && b[*i].is_ascii_digit() {
            *i += 1;
        }
        *i - start
    };
    if i < b.len() && b[i] == b'.' {
        i += 1;
        if digits(&mut i) == 0 {
            return false;
        }
    } else {
        if digits(&mut i) == 0 {
            return false;
        }
        if i < b.len() && b[i] == b'.' {
            i += 1;
            digits(&mut i);
        }
    }
    if i < b.len() && matches!(b[i], b'e' | b'E') {
        i += 1;
        if i < b.len() && matches!(b[i], b'+' | b'-') {
            i += 1;
        }
        if digits(&mut i) == 0 {
            return false;
        }
    }
    i == b.len()
}

/// `YYYY-M-D`, optionally followed by `T`/`t`/space and a time.
fn is_timestamp(s: &str) -> bool {
    let b = s.as_bytes();
    if b.len() < 8 || !b[..4].iter().all(u8::is_ascii_digit) || b[4] != b'-' {
        return false;
    }
    let mut i = 5;
    for part in 0..2 {
        let start = i;
        while i < b.len() && b[i].is_ascii_digit() {
            i += 1;
        }
        if i == start || i - start > 2 {
            return false;
        }
        if part == 0 {
            if i >= b.len() || b[i] != b'-' {
                return false;
            }
            i += 1;
        }
    }
    if i == b.len() {
        return true;
    }
    if !matches!(b[i], b'T' | b't' | b' ') {
        return false;
    }
    let rest = &s[i + 1..];
    let mut parts = rest.splitn(3, ':');
    let (Some(h), Some(m), Some(sec)) = (parts.next(), parts.next(), parts.next()) else {
        return false;
    };
    let num = |p: &str| !p.is_empty() && p.len() <= 2 && p.bytes().all(|c| c.is_ascii_digit());
    num(h) && num(m) && sec.len() >= 2 && sec.as_bytes()[..1].iter().all(u8::is_ascii_digit)
}

/// YAML 1.1 booleans that the YAML library quotes when they are strings.
pub(super) fn is_old_bool(value: &str) -> bool {
    matches!(
        value,
        "y" | "Y"
            | "yes"
            | "Yes"
            | "YES"
            | "n"
            | "N"
            | "no"
            | "No"
            | "NO"
            | "on"
            | "On"
            | "ON"
            | "off"
            | "Off"
            | "OFF"
    )
}

/// `^[-+]?[0-9][0-9_]*(?::[0-5]?[0-9])+(?:\.[0-9_]*)?$`
pub(super) fn is_base60_float(value: &str) -> bool {
    let s = value.strip_prefix(['+', '-']).unwrap_or(value);
    let (main, frac) = match s.split_once('.') {
        Some((m, f)) => (m, Some(f)),
        None => (s, None),
    };
    if let Some(f) = frac
        && !f.bytes().all(|c| c.is_ascii_digit() || c == b'_')
    {
        return false;
    }
    let mut parts = main.split(':');
    let Some(head) = parts.next() else {
        return false;
    };
    if head.is_empty()
        || !head.as_bytes()[0].is_ascii_digit()
        || !head.bytes().all(|c| c.is_ascii_digit() || c == b'_')
    {
        return false;
    }
    let mut count = 0;
    for part in parts {
        count += 1;
        let ok = match part.as_bytes() {
            [d] => d.is_ascii_digit(),
            [a, d] => (b'0'..=b'5').contains(a) && d.is_ascii_digit(),
            _ => false,
        };
        if !ok {
            return false;
        }
    }
    count > 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resolves_like_the_yaml_library() {
        for (value, tag) in [
            ("", "!!null"),
            ("~", "!!null"),
            ("true", "!!bool"),
            ("yes", "!!str"),
            ("1", "!!int"),
            ("-12", "!!int"),
            ("0x1F", "!!int"),
            ("0777", "!!int"),
            ("0o17", "!!int"),
            ("1_000", "!!int"),
            ("1.5", "!!float"),
            (".5", "!!float"),
            ("1e3", "!!float"),
            (".inf", "!!float"),
            ("2021-01-01", "!!timestamp"),
            ("2021-1-1T10:00:00Z", "!!timestamp"),
            ("1.2.3", "!!str"),
            ("v1", "!!str"),
            ("-", "!!str"),
            ("0x", "!!str"),
            ("08", "!!float"),
        ] {
            assert_eq!(resolve_plain(value), tag, "{value}");
        }
        assert!(is_old_bool("on"));
        assert!(is_base60_float("1:20"));
        assert!(!is_base60_float("1:60"));
        assert!(!is_base60_float("a:1"));
    }
}

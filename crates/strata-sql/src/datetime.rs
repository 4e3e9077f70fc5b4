//! Spark's datetime patterns (`yyyy-MM-dd HH:mm:ss`), as `to_timestamp`, `to_date` and
//! `date_format` take them in Databricks SQL, turned into the chrono patterns
//! (`%Y-%m-%d %H:%M:%S`) DataFusion's functions read.
//!
//! A pattern holding `%` is already chrono's and is left as it is. Spark's rules: a run
//! of one letter is one field, its length the width (`M` a month without padding, `MM` two
//! digits, `MMM` `Jan`, `MMMM` `January`); text in single quotes is literal (`''` is a
//! quote); other characters are literal.

/// The chrono pattern of a Spark datetime pattern, or why there is none.
pub fn spark_datetime_pattern(pattern: &str) -> Result<String, String> {
    if pattern.contains('%') {
        return Ok(pattern.to_string());
    }
    let chars: Vec<char> = pattern.chars().collect();
    let mut out = String::new();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        if c == '\'' {
            i = quoted(&chars, i + 1, &mut out)
                .ok_or_else(|| format!("the quote at position {} is not closed", i + 1))?;
            continue;
        }
        if !c.is_ascii_alphabetic() {
            out.push(c);
            i += 1;
            continue;
        }
        let run = chars[i..].iter().take_while(|&&d| d == c).count();
        out.push_str(&field(c, run).ok_or_else(|| {
            format!(
                "the pattern letter '{}' (in '{pattern}') is not supported; use y M d H h m s \
                 S a E D z Z X x, or a chrono pattern with %",
                c.to_string().repeat(run)
            )
        })?);
        i += run;
    }
    Ok(out)
}

/// Copies quoted text from `chars[start..]` up to its closing quote; the index after it.
fn quoted(chars: &[char], start: usize, out: &mut String) -> Option<usize> {
    let mut i = start;
    if chars.get(i) == Some(&'\'') {
        out.push('\'');
        return Some(i + 1);
    }
    while i < chars.len() {
        match chars[i] {
            '\'' if chars.get(i + 1) == Some(&'\'') => {
                out.push('\'');
                i += 2;
            }
            '\'' => return Some(i + 1),
            c => {
                out.push(c);
                i += 1;
            }
        }
    }
    None
}

/// The chrono specifier of `run` repetitions of the Spark pattern letter `c`.
fn field(c: char, run: usize) -> Option<String> {
    let padded = |short: &str, long: &str| if run == 1 { short } else { long }.to_string();
    Some(match c {
        'y' | 'u' if run == 2 => "%y".into(),
        'y' | 'u' => "%Y".into(),
        'M' | 'L' => match run {
            1 => "%-m".into(),
            2 => "%m".into(),
            3 => "%b".into(),
            _ => "%B".into(),
        },
        'd' => padded("%-d", "%d"),
        'D' => "%j".into(),
        'H' => padded("%-H", "%H"),
        'h' => padded("%-I", "%I"),
        'm' => padded("%-M", "%M"),
        's' => padded("%-S", "%S"),
        'S' => match run {
            1..=3 => "%3f".into(),
            4..=6 => "%6f".into(),
            _ => "%9f".into(),
        },
        'a' => "%p".into(),
        'E' if run >= 4 => "%A".into(),
        'E' => "%a".into(),
        'z' => "%Z".into(),
        'Z' | 'x' if run <= 2 => "%z".into(),
        'X' if run == 1 => "%z".into(),
        'X' | 'x' | 'Z' => "%:z".into(),
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spark_patterns_become_chrono_ones() {
        let cases = [
            ("yyyy-MM-dd HH:mm:ss", "%Y-%m-%d %H:%M:%S"),
            ("yyyy-MM-dd'T'HH:mm:ss.SSSXXX", "%Y-%m-%dT%H:%M:%S.%3f%:z"),
            ("dd/MM/yy", "%d/%m/%y"),
            ("d MMM yyyy", "%-d %b %Y"),
            ("EEEE, MMMM d", "%A, %B %-d"),
            ("hh:mm a", "%I:%M %p"),
            ("yyyyMMddHHmmssSSSSSS", "%Y%m%d%H%M%S%6f"),
            ("'o''clock' H", "o'clock %-H"),
            ("yyyy-MM-dd''", "%Y-%m-%d'"),
            ("%Y-%m-%d", "%Y-%m-%d"),
        ];
        for (spark, chrono) in cases {
            assert_eq!(spark_datetime_pattern(spark).unwrap(), chrono, "{spark}");
        }
    }

    #[test]
    fn unknown_letters_and_open_quotes_are_named() {
        let e = spark_datetime_pattern("GG yyyy").unwrap_err();
        assert!(e.contains("'GG'"), "{e}");
        let e = spark_datetime_pattern("yyyy 'at").unwrap_err();
        assert!(e.contains("not closed"), "{e}");
    }
}

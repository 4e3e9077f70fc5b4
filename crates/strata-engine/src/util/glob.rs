//! Spark's (Hadoop's) file globs in `read_files` paths: `*` (any characters but `/`), `?`
//! (one character but `/`), `[abc]`, `[a-z]`, `[^a]` (`[!a]` too), `{a,b}` (alternatives,
//! nested, may hold `/`) and `\` escaping the next character.
//!
//! A path is split where its glob starts ([`split`]): the folder before the first segment
//! holding a glob character is listed, and the files below it are kept when a leading part
//! of their relative path matches the rest ([`Glob::matches`]): a pattern matching a folder
//! takes the files under it, as Spark reads a folder a glob names.

/// A compiled glob: its alternatives with the braces expanded.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Glob {
    /// The pattern as written (for messages).
    text: String,
    alternatives: Vec<Vec<Piece>>,
}

#[derive(Debug, Clone, PartialEq)]
enum Piece {
    Char(char),
    /// `?`
    One,
    /// `*`
    Any,
    /// `[...]`: ranges (a single character is a range of one) and whether it is negated.
    Class(Vec<(char, char)>, bool),
}

/// Whether `c` starts a glob in a path segment.
fn is_glob_char(c: char) -> bool {
    matches!(c, '*' | '?' | '[' | '{')
}

/// Whether `segment` holds an unescaped glob character.
fn has_glob(segment: &str) -> bool {
    let mut chars = segment.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' => {
                chars.next();
            }
            c if is_glob_char(c) => return true,
            _ => {}
        }
    }
    false
}

/// `path` as the folder to list and the glob below it, if any segment holds a glob
/// character: `data/2024-*/*.csv` is `("data", Some("2024-*/*.csv"))`, `*.csv` is `(".",
/// Some("*.csv"))`, `s3://b/in/*.json` is `("s3://b/in", Some("*.json"))`.
pub(crate) fn split(path: &str) -> (String, Option<String>) {
    let segments: Vec<&str> = path.split('/').collect();
    match segments.iter().position(|s| has_glob(s)) {
        None => (path.to_string(), None),
        Some(at) => {
            let base = segments[..at].join("/");
            let base = match base.as_str() {
                "" if path.starts_with('/') => "/".to_string(),
                "" => ".".to_string(),
                _ => base,
            };
            (base, Some(segments[at..].join("/")))
        }
    }
}

impl Glob {
    /// Compiles `text`; an unclosed `[` or `{` is an error saying so.
    pub(crate) fn new(text: &str) -> Result<Glob, String> {
        let chars: Vec<char> = text.chars().collect();
        let expanded = expand(&chars).map_err(|e| format!("glob '{text}': {e}"))?;
        let alternatives = expanded
            .iter()
            .map(|a| pieces(a))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| format!("glob '{text}': {e}"))?;
        Ok(Glob {
            text: text.to_string(),
            alternatives,
        })
    }

    /// The pattern as written.
    pub(crate) fn as_str(&self) -> &str {
        &self.text
    }

    /// Whether file `relative` (`/`-separated, relative to the listed folder) is taken: the
    /// whole path, or a leading run of its folders, matches.
    pub(crate) fn matches(&self, relative: &str) -> bool {
        let chars: Vec<char> = relative.chars().collect();
        let mut ends: Vec<usize> = chars
            .iter()
            .enumerate()
            .filter(|(_, c)| **c == '/')
            .map(|(i, _)| i)
            .collect();
        ends.push(chars.len());
        ends.into_iter().any(|end| {
            self.alternatives
                .iter()
                .any(|a| match_here(a, &chars[..end]))
        })
    }
}

/// The brace alternatives of `chars`, expanded (`a{b,c{d,e}}` is `ab`, `acd`, `ace`); other
/// characters, escapes included, are kept as they are.
fn expand(chars: &[char]) -> Result<Vec<Vec<char>>, String> {
    let mut i = 0;
    while i < chars.len() {
        match chars[i] {
            '\\' => i += 2,
            '[' => {
                // A class may hold `{` or `,`: skip it whole.
                i = class_end(chars, i).ok_or("'[' is not closed by ']'")? + 1;
            }
            '{' => {
                let (close, commas) = brace_parts(chars, i)?;
                let head = &chars[..i];
                let tail = expand(&chars[close + 1..])?;
                let mut out = Vec::new();
                let mut start = i + 1;
                for end in commas.into_iter().chain(std::iter::once(close)) {
                    for inner in expand(&chars[start..end])? {
                        for t in &tail {
                            let mut v = head.to_vec();
                            v.extend(&inner);
                            v.extend(t);
                            out.push(v);
                        }
                    }
                    start = end + 1;
                }
                return Ok(out);
            }
            _ => i += 1,
        }
    }
    Ok(vec![chars.to_vec()])
}

/// The `}` closing the `{` at `open` and the top-level commas between them.
fn brace_parts(chars: &[char], open: usize) -> Result<(usize, Vec<usize>), String> {
    let mut depth = 0usize;
    let mut commas = Vec::new();
    let mut i = open;
    while i < chars.len() {
        match chars[i] {
            '\\' => i += 1,
            '[' => i = class_end(chars, i).ok_or("'[' is not closed by ']'")?,
            '{' => depth += 1,
            '}' => {
                depth -= 1;
                if depth == 0 {
                    return Ok((i, commas));
                }
            }
            ',' if depth == 1 => commas.push(i),
            _ => {}
        }
        i += 1;
    }
    Err("'{' is not closed by '}'".into())
}

/// The `]` closing the class opened at `open` (a `]` right after `[`, `[^` or `[!` is a
/// member).
fn class_end(chars: &[char], open: usize) -> Option<usize> {
    let mut i = open + 1;
    if matches!(chars.get(i), Some('^' | '!')) {
        i += 1;
    }
    if chars.get(i) == Some(&']') {
        i += 1;
    }
    while i < chars.len() {
        match chars[i] {
            '\\' => i += 1,
            ']' => return Some(i),
            _ => {}
        }
        i += 1;
    }
    None
}

/// One alternative (braces expanded) as pieces.
fn pieces(chars: &[char]) -> Result<Vec<Piece>, String> {
    let mut out = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        match chars[i] {
            '\\' => {
                let c = *chars.get(i + 1).ok_or("it ends with '\\'")?;
                out.push(Piece::Char(c));
                i += 2;
            }
            '*' => {
                if out.last() != Some(&Piece::Any) {
                    out.push(Piece::Any);
                }
                i += 1;
            }
            '?' => {
                out.push(Piece::One);
                i += 1;
            }
            '[' => {
                let end = class_end(chars, i).ok_or("'[' is not closed by ']'")?;
                let mut j = i + 1;
                let negated = matches!(chars.get(j), Some('^' | '!'));
                if negated {
                    j += 1;
                }
                let mut ranges = Vec::new();
                while j < end {
                    let mut c = chars[j];
                    if c == '\\' && j + 1 < end {
                        j += 1;
                        c = chars[j];
                    }
                    if chars.get(j + 1) == Some(&'-') && j + 2 < end {
                        let hi = chars[j + 2];
                        if hi < c {
                            return Err(format!("range {c}-{hi} is empty"));
                        }
                        ranges.push((c, hi));
                        j += 3;
                    } else {
                        ranges.push((c, c));
                        j += 1;
                    }
                }
                out.push(Piece::Class(ranges, negated));
                i = end + 1;
            }
            c => {
                out.push(Piece::Char(c));
                i += 1;
            }
        }
    }
    Ok(out)
}

/// Whether `pieces` match all of `text`; `*` and `?` never match `/`.
fn match_here(pieces: &[Piece], text: &[char]) -> bool {
    match pieces.split_first() {
        None => text.is_empty(),
        Some((Piece::Any, rest)) => {
            let mut i = 0;
            loop {
                if match_here(rest, &text[i..]) {
                    return true;
                }
                match text.get(i) {
                    Some('/') | None => return false,
                    Some(_) => i += 1,
                }
            }
        }
        Some((piece, rest)) => {
            let Some((&c, tail)) = text.split_first() else {
                return false;
            };
            let fits = match piece {
                Piece::Char(p) => *p == c,
                Piece::One => c != '/',
                Piece::Class(ranges, negated) => {
                    c != '/' && ranges.iter().any(|(lo, hi)| (*lo..=*hi).contains(&c)) != *negated
                }
                Piece::Any => false,
            };
            fits && match_here(rest, tail)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn glob(p: &str) -> Glob {
        Glob::new(p).expect("valid glob")
    }

    #[test]
    fn paths_split_where_the_glob_starts() {
        assert_eq!(split("data/in"), ("data/in".into(), None));
        assert_eq!(split("data/*.csv"), ("data".into(), Some("*.csv".into())));
        assert_eq!(
            split("data/2024-*/x/*.csv"),
            ("data".into(), Some("2024-*/x/*.csv".into()))
        );
        assert_eq!(split("*.csv"), (".".into(), Some("*.csv".into())));
        assert_eq!(split("/in/{a,b}"), ("/in".into(), Some("{a,b}".into())));
        assert_eq!(split("/*.csv"), ("/".into(), Some("*.csv".into())));
        assert_eq!(
            split("s3://bucket/in/part-?.json"),
            ("s3://bucket/in".into(), Some("part-?.json".into()))
        );
        // An escaped glob character is a plain one.
        assert_eq!(split("data/a\\*b"), ("data/a\\*b".into(), None));
    }

    #[test]
    fn stars_and_question_marks_stay_within_a_segment() {
        let g = glob("*.csv");
        assert!(g.matches("a.csv"));
        assert!(g.matches(".csv"));
        assert!(!g.matches("a.json"));
        assert!(!g.matches("sub/a.csv"));
        let g = glob("part-?.json");
        assert!(g.matches("part-1.json"));
        assert!(!g.matches("part-10.json"));
        assert!(glob("*/*.csv").matches("sub/a.csv"));
        assert!(!glob("*/*.csv").matches("a.csv"));
        assert!(glob("a*b*c").matches("aXbYbZc"));
    }

    #[test]
    fn classes_ranges_and_negation() {
        let g = glob("day[0-2].csv");
        assert!(g.matches("day0.csv") && g.matches("day2.csv"));
        assert!(!g.matches("day3.csv"));
        assert!(glob("[^a]x").matches("bx"));
        assert!(!glob("[^a]x").matches("ax"));
        assert!(glob("[!a]x").matches("bx"));
        assert!(glob("[]]").matches("]"));
        assert!(glob("[ab-]").matches("-"));
        assert!(Glob::new("[b-a]").is_err());
        assert!(Glob::new("[ab").is_err());
    }

    #[test]
    fn braces_are_alternatives_nested_and_across_folders() {
        let g = glob("{a,b}.csv");
        assert!(g.matches("a.csv") && g.matches("b.csv"));
        assert!(!g.matches("c.csv"));
        let g = glob("x{1,2{a,b}}");
        for name in ["x1", "x2a", "x2b"] {
            assert!(g.matches(name), "{name}");
        }
        assert!(!g.matches("x2"));
        let g = glob("{2024/01,2025}/*.json");
        assert!(g.matches("2024/01/a.json"));
        assert!(g.matches("2025/b.json"));
        assert!(!g.matches("2024/02/a.json"));
        assert!(glob("{a,[,]}").matches(","));
        assert!(Glob::new("{a,b").is_err());
    }

    #[test]
    fn a_glob_naming_a_folder_takes_the_files_under_it() {
        let g = glob("2024-*");
        assert!(g.matches("2024-01/a.json"));
        assert!(g.matches("2024-02/deep/b.json"));
        assert!(!g.matches("2023-12/a.json"));
    }

    #[test]
    fn escapes_make_glob_characters_plain() {
        let g = glob("a\\*b");
        assert!(g.matches("a*b"));
        assert!(!g.matches("aXb"));
        assert!(glob("\\{x\\}").matches("{x}"));
    }
}

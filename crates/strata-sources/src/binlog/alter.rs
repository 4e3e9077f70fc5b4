//! `ALTER TABLE` statements of the binlog, as changes to a table's columns, and the
//! columns a table had before the ALTERs a read meets.
//!
//! The binlog's row images are positional and carry no column names (unless the server logs
//! `binlog_row_metadata = FULL`), so the change read names a row's values by the table's
//! columns as information_schema lists them when the read begins. When ALTERs that only add
//! columns lie between the position read from and that moment, the rows logged before each
//! of them have fewer values: [`timeline`] takes the added columns back out, ALTER by ALTER
//! from the last, which gives the columns of the rows before the first ALTER and after each.
//! Any other change to the columns (dropped, renamed, redefined) cannot be followed.

use super::{table_name, tokens, TableName, Token};

/// What one clause of an `ALTER TABLE` does to the table's columns.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum ColumnChange {
    /// `ADD [COLUMN] x ...`, `ADD [COLUMN] (a ..., b ...)`, at any position (`FIRST`, `AFTER
    /// c`).
    Added(Vec<String>),
    /// `DROP [COLUMN] x`.
    Dropped(String),
    /// `RENAME COLUMN a TO b`, `CHANGE a b ...`.
    Renamed { from: String, to: String },
    /// `MODIFY x ...`, `CHANGE x x ...`: the column's definition (its type, perhaps) changed.
    Redefined(String),
    /// A clause that leaves the columns and their values as they are (`ADD INDEX`,
    /// `ALGORITHM = INSTANT`, `ALTER COLUMN x SET DEFAULT 0`).
    Kept,
    /// Any other clause (`RENAME TO`, `CONVERT TO CHARACTER SET`, ...): its first words.
    Other(String),
}

impl ColumnChange {
    /// How the clause changes the columns, when binlog CDC cannot follow it.
    pub(crate) fn refusal(&self) -> Option<String> {
        match self {
            ColumnChange::Added(_) | ColumnChange::Kept => None,
            ColumnChange::Dropped(c) => Some(format!("column `{c}` was dropped")),
            ColumnChange::Renamed { from, to } => {
                Some(format!("column `{from}` was renamed to `{to}`"))
            }
            ColumnChange::Redefined(c) => Some(format!(
                "column `{c}` was redefined (MODIFY / CHANGE: its type may have changed)"
            )),
            ColumnChange::Other(words) => Some(format!("the table was changed by `{words}`")),
        }
    }
}

/// An `ALTER TABLE` statement: the table it names (`None`: not one) and its clauses.
pub(crate) fn parse_alter(sql: &str) -> Option<(TableName, Vec<ColumnChange>)> {
    let toks = tokens(sql);
    let at = |i: usize, k: &str| toks.get(i).is_some_and(|t| t.keyword(k));
    if !at(0, "ALTER") {
        return None;
    }
    let mut i = 1;
    while at(i, "ONLINE") || at(i, "IGNORE") {
        i += 1;
    }
    if !at(i, "TABLE") {
        return None;
    }
    i += 1;
    if at(i, "IF") && at(i + 1, "EXISTS") {
        i += 2;
    }
    let (table, mut i) = table_name(&toks, i)?;
    // MariaDB: `ALTER TABLE t WAIT 5 ADD ...`, `NOWAIT`.
    if at(i, "WAIT") {
        i += 2;
    } else if at(i, "NOWAIT") {
        i += 1;
    }
    let changes = split_top(&toks[i.min(toks.len())..])
        .into_iter()
        .filter(|c| !c.is_empty())
        .map(clause)
        .collect();
    Some((table, changes))
}

/// Slices of `toks` separated by commas outside parentheses.
fn split_top(toks: &[Token]) -> Vec<&[Token]> {
    let mut out = Vec::new();
    let (mut depth, mut start) = (0i32, 0);
    for (i, t) in toks.iter().enumerate() {
        match t {
            Token::Punct('(') => depth += 1,
            Token::Punct(')') => depth -= 1,
            Token::Punct(',') if depth == 0 => {
                out.push(&toks[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    out.push(&toks[start..]);
    out
}

/// Words that start a table option or a clause that keeps the columns.
const KEEPING: &[&str] = &[
    "ALGORITHM",
    "LOCK",
    "FORCE",
    "COMMENT",
    "AUTO_INCREMENT",
    "ENGINE",
    "ROW_FORMAT",
    "KEY_BLOCK_SIZE",
    "STATS_PERSISTENT",
    "STATS_AUTO_RECALC",
    "STATS_SAMPLE_PAGES",
    "ENABLE",
    "DISABLE",
    "ALTER",
];

/// Index-like things `ADD` / `DROP` name instead of a column.
const INDEX_LIKE: &[&str] = &[
    "INDEX",
    "KEY",
    "UNIQUE",
    "FULLTEXT",
    "SPATIAL",
    "FOREIGN",
    "CHECK",
    "CONSTRAINT",
    "PRIMARY",
    "PARTITION",
];

fn clause(toks: &[Token]) -> ColumnChange {
    let at = |i: usize, k: &str| toks.get(i).is_some_and(|t| t.keyword(k));
    let name = |i: usize| toks.get(i).and_then(Token::name).map(str::to_string);
    let words = || {
        toks.iter()
            .take(3)
            .filter_map(Token::name)
            .collect::<Vec<_>>()
            .join(" ")
    };
    let other = || ColumnChange::Other(words());
    let index_like = |i: usize| INDEX_LIKE.iter().any(|k| at(i, k));
    if KEEPING.iter().any(|k| at(0, k)) {
        return ColumnChange::Kept;
    }
    if at(0, "ADD") {
        let column = at(1, "COLUMN");
        let mut i = 1 + column as usize;
        if at(i, "IF") && at(i + 1, "NOT") && at(i + 2, "EXISTS") {
            i += 3;
        }
        if toks.get(i) == Some(&Token::Punct('(')) {
            let inner = &toks[i + 1..toks.len().saturating_sub(1).max(i + 1)];
            let names: Option<Vec<String>> = split_top(inner)
                .into_iter()
                .filter(|d| !d.is_empty())
                .map(|d| d.first().and_then(Token::name).map(str::to_string))
                .collect();
            return names.map_or_else(other, ColumnChange::Added);
        }
        if !column && (at(i, "PERIOD") || at(i, "SYSTEM")) {
            return other();
        }
        if !column && index_like(i) {
            return ColumnChange::Kept;
        }
        return name(i).map_or_else(other, |n| ColumnChange::Added(vec![n]));
    }
    if at(0, "DROP") {
        let column = at(1, "COLUMN");
        let mut i = 1 + column as usize;
        if !column && (at(i, "SYSTEM") || at(i, "PERIOD")) {
            return other();
        }
        if !column && index_like(i) {
            return ColumnChange::Kept;
        }
        if at(i, "IF") && at(i + 1, "EXISTS") {
            i += 2;
        }
        return name(i).map_or_else(other, ColumnChange::Dropped);
    }
    if at(0, "CHANGE") {
        let mut i = 1 + at(1, "COLUMN") as usize;
        if at(i, "IF") && at(i + 1, "EXISTS") {
            i += 2;
        }
        return match (name(i), name(i + 1)) {
            (Some(from), Some(to)) if from.eq_ignore_ascii_case(&to) => {
                ColumnChange::Redefined(from)
            }
            (Some(from), Some(to)) => ColumnChange::Renamed { from, to },
            _ => other(),
        };
    }
    if at(0, "MODIFY") {
        let mut i = 1 + at(1, "COLUMN") as usize;
        if at(i, "IF") && at(i + 1, "EXISTS") {
            i += 2;
        }
        return name(i).map_or_else(other, ColumnChange::Redefined);
    }
    if at(0, "RENAME") {
        if at(1, "INDEX") || at(1, "KEY") {
            return ColumnChange::Kept;
        }
        if at(1, "COLUMN") {
            let mut i = 2;
            if at(i, "IF") && at(i + 1, "EXISTS") {
                i += 2;
            }
            if let (Some(from), true, Some(to)) = (name(i), at(i + 1, "TO"), name(i + 2)) {
                return ColumnChange::Renamed { from, to };
            }
        }
        return other();
    }
    other()
}

/// The columns a table had (as indices into `now`, its columns when the read began) before
/// the ALTERs `alters` (each one's clauses, in binlog order; the columns now are the ones
/// after the last), and after each of them: the added columns taken back out, from the
/// last ALTER to the first. An error says the first change that cannot be followed.
pub(crate) fn timeline(
    now: &[String],
    alters: &[Vec<ColumnChange>],
) -> std::result::Result<(Vec<usize>, Vec<Vec<usize>>), String> {
    if let Some(refusal) = alters.iter().flatten().find_map(ColumnChange::refusal) {
        return Err(refusal);
    }
    let mut columns: Vec<usize> = (0..now.len()).collect();
    let mut after = Vec::with_capacity(alters.len());
    for alter in alters.iter().rev() {
        after.push(columns.clone());
        for change in alter {
            let ColumnChange::Added(names) = change else {
                continue;
            };
            for added in names {
                let Some(at) = columns
                    .iter()
                    .position(|&i| now[i].eq_ignore_ascii_case(added))
                else {
                    return Err(format!(
                        "column `{added}`, added by an ALTER TABLE, is not among the table's \
                         columns now (dropped or renamed since)"
                    ));
                };
                columns.remove(at);
            }
        }
    }
    after.reverse();
    Ok((columns, after))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(v: &str) -> String {
        v.to_string()
    }

    fn changes(sql: &str) -> Vec<ColumnChange> {
        parse_alter(sql).expect(sql).1
    }

    #[test]
    fn added_columns_are_read_in_every_form() {
        use ColumnChange::*;
        let (table, c) = parse_alter("ALTER ONLINE TABLE `crm`.`o` ADD COLUMN x INT").unwrap();
        assert_eq!(table, (Some(s("crm")), s("o")));
        assert_eq!(c, vec![Added(vec![s("x")])]);
        assert_eq!(
            changes("alter table o add y varchar(10) DEFAULT 'a,b' AFTER id"),
            vec![Added(vec![s("y")])]
        );
        assert_eq!(
            changes(
                "ALTER TABLE o ADD COLUMN (a INT, `b c` DECIMAL(10,2) NULL) , ALGORITHM=INSTANT"
            ),
            vec![Added(vec![s("a"), s("b c")]), Kept]
        );
        assert_eq!(
            changes("ALTER TABLE IF EXISTS o WAIT 3 ADD COLUMN IF NOT EXISTS z INT FIRST, ADD INDEX (z)"),
            vec![Added(vec![s("z")]), Kept]
        );
        assert_eq!(
            changes(
                "ALTER TABLE o ADD UNIQUE KEY u (a), DROP INDEX i, ALTER COLUMN a SET DEFAULT 1"
            ),
            vec![Kept, Kept, Kept]
        );
    }

    #[test]
    fn other_changes_name_the_column_and_what_happened() {
        use ColumnChange::*;
        assert_eq!(
            changes("ALTER TABLE o DROP COLUMN x"),
            vec![Dropped(s("x"))]
        );
        assert_eq!(changes("ALTER TABLE o DROP `y`"), vec![Dropped(s("y"))]);
        assert_eq!(
            changes("ALTER TABLE o CHANGE COLUMN a b INT"),
            vec![Renamed {
                from: s("a"),
                to: s("b")
            }]
        );
        assert_eq!(
            changes("ALTER TABLE o CHANGE a A BIGINT"),
            vec![Redefined(s("a"))]
        );
        assert_eq!(
            changes("ALTER TABLE o MODIFY n BIGINT"),
            vec![Redefined(s("n"))]
        );
        assert_eq!(
            changes("ALTER TABLE o RENAME COLUMN a TO b"),
            vec![Renamed {
                from: s("a"),
                to: s("b")
            }]
        );
        assert_eq!(
            changes("ALTER TABLE o RENAME TO p"),
            vec![Other(s("RENAME TO p"))]
        );
        assert_eq!(Dropped(s("x")).refusal().unwrap(), "column `x` was dropped");
        assert!(parse_alter("ALTER DATABASE d CHARACTER SET utf8").is_none());
    }

    #[test]
    fn the_columns_before_each_alter_are_the_added_ones_taken_out() {
        use ColumnChange::*;
        let now = vec![s("z"), s("id"), s("v"), s("a"), s("b")];
        // ADD a, then ADD (z FIRST, b): before both, id and v.
        let alters = vec![
            vec![Added(vec![s("A")])],
            vec![Added(vec![s("z"), s("b")]), Kept],
        ];
        let (start, after) = timeline(&now, &alters).unwrap();
        assert_eq!(start, vec![1, 2]);
        assert_eq!(after, vec![vec![1, 2, 3], vec![0, 1, 2, 3, 4]]);
        assert_eq!(timeline(&now, &[]).unwrap(), (vec![0, 1, 2, 3, 4], vec![]));
        let gone = timeline(&now, &[vec![Added(vec![s("w")])]]).unwrap_err();
        assert!(gone.contains("`w`"), "{gone}");
        let dropped = timeline(&now, &[vec![Added(vec![s("a")])], vec![Dropped(s("c"))]]);
        assert_eq!(dropped.unwrap_err(), "column `c` was dropped");
    }
}

//! The configuration text as written: parsed with positions (toml_edit), checked against the
//! schema table before any deserialization so that every unknown key, wrong type and missing
//! key is reported in one run with its `file:line:column`, and used afterwards to place the
//! validation problems at their keys. The `NVMFD_*` overrides are checked here too, each
//! problem naming its variable.

use std::ops::Range;

use toml_edit::{ImDocument, Item, TableLike, Value};

use crate::report::{Problem, ProblemKind};
use crate::schema::{self, Scalar, Type};

/// Where problems are reported: a file (with positions), or text without useful positions
/// (the embedded default).
pub(crate) struct Source {
    origin: String,
    /// Whether line numbers mean something to the reader.
    positions: bool,
    doc: ImDocument<String>,
}

impl Source {
    /// Parses `text`; a syntax error is the one problem reported (nothing after it can be
    /// trusted).
    pub(crate) fn parse(origin: &str, text: &str, positions: bool) -> Result<Source, Box<Problem>> {
        match ImDocument::parse(text.to_owned()) {
            Ok(doc) => Ok(Source {
                origin: origin.to_owned(),
                positions,
                doc,
            }),
            Err(e) => {
                let mut problem = Problem::new(
                    ProblemKind::Syntax,
                    "",
                    "",
                    // One line: toml's message may span several.
                    format!(
                        "TOML syntax error: {}",
                        e.message().trim_end().replace('\n', "; ")
                    ),
                );
                problem.file = Some(origin.to_owned());
                if positions {
                    if let Some(span) = e.span() {
                        let (line, column) = line_column(text, span.start);
                        problem.line = Some(line);
                        problem.column = Some(column);
                    }
                }
                Err(Box::new(problem))
            }
        }
    }

    /// Every unknown key, wrong type and missing required key, in file order.
    pub(crate) fn check(&self) -> Vec<Problem> {
        let mut problems = Vec::new();
        self.check_table(self.doc.as_table(), "", "", None, &mut problems);
        problems
    }

    /// A problem of this file at `span` (or without position).
    fn problem(
        &self,
        kind: ProblemKind,
        key: &str,
        value: &str,
        message: String,
        span: Option<Range<usize>>,
    ) -> Problem {
        let mut problem = Problem::new(kind, key, value, message);
        problem.file = Some(self.origin.clone());
        if let Some(span) = span.filter(|_| self.positions) {
            let (line, column) = line_column(self.doc.raw(), span.start);
            problem.line = Some(line);
            problem.column = Some(column);
        }
        problem
    }

    /// `generic`/`shown`: the table's path as in the schema (`subsystems[]`) and as displayed
    /// (`subsystems[2]`); `span`: where the table starts, for keys it lacks.
    fn check_table(
        &self,
        table: &dyn TableLike,
        generic: &str,
        shown: &str,
        span: Option<Range<usize>>,
        problems: &mut Vec<Problem>,
    ) {
        for (name, item) in table.iter() {
            let key_span = table.get_key_value(name).and_then(|(k, _)| k.span());
            let path = join(shown, name);
            let Some(key) = schema::KEYS.iter().find(|k| k.path == join(generic, name)) else {
                let hint = schema::suggest(generic, name)
                    .map(|s| format!(" (did you mean {s}?)"))
                    .unwrap_or_default();
                let what = if generic.is_empty() {
                    "unknown section"
                } else {
                    "unknown key"
                };
                problems.push(self.problem(
                    ProblemKind::UnknownKey,
                    &path,
                    "",
                    format!("{what}{hint}"),
                    key_span,
                ));
                continue;
            };
            let value_span = item.span().or_else(|| key_span.clone());
            self.check_item(key.path, key.ty, item, &path, value_span, problems);
        }
        if !generic.ends_with("[]") {
            // Required top-level keys (`ports`) are validation's: "at least one port".
            return;
        }
        for key in schema::children(generic) {
            let name = schema::leaf(key.path);
            if key.default == schema::Absent::Required && table.get(name).is_none() {
                problems.push(self.problem(
                    ProblemKind::MissingKey,
                    &join(shown, name),
                    "",
                    format!("missing key ({} is required)", key.ty.describe()),
                    span.clone(),
                ));
            }
        }
    }

    fn check_item(
        &self,
        generic: &str,
        ty: Type,
        item: &Item,
        path: &str,
        span: Option<Range<usize>>,
        problems: &mut Vec<Problem>,
    ) {
        let type_error = |found: &str, span| {
            self.problem(
                ProblemKind::WrongType,
                path,
                "",
                format!("expected {}, found {found}", ty.describe()),
                span,
            )
        };
        match (ty, item) {
            (Type::Section, Item::Table(table)) => {
                self.check_table(table, generic, path, table.span(), problems)
            }
            (Type::Section, Item::Value(Value::InlineTable(table))) => {
                self.check_table(table, generic, path, table.span(), problems)
            }
            (Type::Entries, Item::ArrayOfTables(entries)) => {
                for (i, table) in entries.iter().enumerate() {
                    self.check_table(
                        table,
                        &format!("{generic}[]"),
                        &format!("{path}[{i}]"),
                        table.span(),
                        problems,
                    );
                }
            }
            (Type::Entries, Item::Value(Value::Array(array))) => {
                for (i, value) in array.iter().enumerate() {
                    let shown = format!("{path}[{i}]");
                    match value {
                        Value::InlineTable(table) => self.check_table(
                            table,
                            &format!("{generic}[]"),
                            &shown,
                            table.span(),
                            problems,
                        ),
                        other => problems.push(self.problem(
                            ProblemKind::WrongType,
                            &shown,
                            "",
                            format!("expected a table, found {}", other.type_name()),
                            other.span(),
                        )),
                    }
                }
            }
            (Type::IntList { .. } | Type::StrList, Item::Value(Value::Array(array))) => {
                for (i, value) in array.iter().enumerate() {
                    if let Err(message) = schema::check_scalar(ty, scalar(value)) {
                        problems.push(self.problem(
                            ProblemKind::WrongType,
                            &format!("{path}[{i}]"),
                            &shown_value(value),
                            message,
                            value.span(),
                        ));
                    }
                }
            }
            (Type::IntList { .. } | Type::StrList, other) => {
                problems.push(type_error(other.type_name(), span))
            }
            (Type::Section | Type::Entries, other) => {
                problems.push(type_error(other.type_name(), span))
            }
            (_, Item::Value(value)) => {
                if let Err(message) = schema::check_scalar(ty, scalar(value)) {
                    problems.push(self.problem(
                        ProblemKind::WrongType,
                        path,
                        &shown_value(value),
                        message,
                        span,
                    ));
                }
            }
            (_, other) => problems.push(type_error(other.type_name(), span)),
        }
    }

    /// `problem` placed at its key in this file: the deepest part of its key path that the
    /// file contains (the key itself, or the entry or section that lacks it).
    pub(crate) fn place(&self, mut problem: Problem) -> Problem {
        problem.file = Some(self.origin.clone());
        if self.positions {
            if let Some(offset) = self.offset_of(&problem.key) {
                let (line, column) = line_column(self.doc.raw(), offset);
                problem.line = Some(line);
                problem.column = Some(column);
            }
        }
        problem
    }

    fn offset_of(&self, path: &str) -> Option<usize> {
        let mut table: &dyn TableLike = self.doc.as_table();
        let mut found = None;
        let mut parts = path.split('.').peekable();
        while let Some(part) = parts.next() {
            let (name, index) = split_index(part);
            let Some((key, item)) = table.get_key_value(name) else {
                break;
            };
            found = key.span().map(|s| s.start).or(found);
            let item = match index {
                None => item,
                Some(i) => match item {
                    Item::ArrayOfTables(entries) => match entries.get(i) {
                        Some(entry) => {
                            found = entry.span().map(|s| s.start).or(found);
                            table = entry;
                            continue;
                        }
                        None => break,
                    },
                    Item::Value(Value::Array(array)) => match array.get(i) {
                        Some(Value::InlineTable(entry)) => {
                            found = entry.span().map(|s| s.start).or(found);
                            table = entry;
                            continue;
                        }
                        Some(value) => {
                            found = value.span().map(|s| s.start).or(found);
                            break;
                        }
                        None => break,
                    },
                    _ => break,
                },
            };
            if parts.peek().is_none() {
                // The key itself: point at its value when it has one.
                found = item.span().map(|s| s.start).or(found);
                break;
            }
            match item {
                Item::Table(t) => table = t,
                Item::Value(Value::InlineTable(t)) => table = t,
                _ => break,
            }
        }
        found
    }
}

/// `text` without the keys at `paths` (their whole value for a list element such as
/// `global.cpus[2]`): the file as it would be if those mistakes were deleted, so that
/// validation can still report the problems of everything else. `None` if a path cannot be
/// followed.
pub(crate) fn without_keys(text: &str, paths: &[&str]) -> Option<String> {
    let mut doc: toml_edit::DocumentMut = text.parse().ok()?;
    for path in paths {
        // A list element (`global.cpus[2]`): remove the list.
        let path = path
            .strip_suffix(']')
            .and_then(|p| p.rsplit_once('['))
            .map_or(*path, |(list, _)| list);
        let (parent, name) = path.rsplit_once('.').unwrap_or(("", path));
        let mut table: &mut dyn TableLike = doc.as_table_mut();
        for part in parent.split('.').filter(|p| !p.is_empty()) {
            let (key, index) = split_index(part);
            let item = table.get_mut(key)?;
            table = match index {
                None => item.as_table_like_mut()?,
                Some(i) => match item {
                    Item::ArrayOfTables(entries) => entries.get_mut(i)?,
                    Item::Value(Value::Array(array)) => match array.get_mut(i)? {
                        Value::InlineTable(entry) => entry,
                        _ => return None,
                    },
                    _ => return None,
                },
            };
        }
        table.remove(name)?;
    }
    Some(doc.to_string())
}

/// `name[3]` → (`name`, Some(3)).
fn split_index(part: &str) -> (&str, Option<usize>) {
    match part.split_once('[') {
        Some((name, rest)) => (name, rest.trim_end_matches(']').parse().ok()),
        None => (part, None),
    }
}

fn join(parent: &str, name: &str) -> String {
    if parent.is_empty() {
        name.to_owned()
    } else {
        format!("{parent}.{name}")
    }
}

fn scalar(value: &Value) -> Scalar<'_> {
    match value {
        Value::Integer(n) => Scalar::Int(*n.value()),
        Value::String(s) => Scalar::Str(s.value()),
        Value::Boolean(_) => Scalar::Bool,
        Value::Float(_) => Scalar::Other("float"),
        Value::Datetime(_) => Scalar::Other("date-time"),
        Value::Array(_) => Scalar::Other("array"),
        Value::InlineTable(_) => Scalar::Other("table"),
    }
}

/// A value as written (without decoration), for messages.
fn shown_value(value: &Value) -> String {
    match value {
        Value::String(s) => s.value().clone(),
        other => other.clone().decorated("", "").to_string(),
    }
}

/// 1-based line and column (in characters) of a byte offset.
fn line_column(text: &str, offset: usize) -> (usize, usize) {
    let before = &text[..offset.min(text.len())];
    let line = before.matches('\n').count() + 1;
    let line_start = before.rfind('\n').map_or(0, |i| i + 1);
    (line, before[line_start..].chars().count() + 1)
}

/// One `NVMFD_<SECTION>__<KEY>` override: the key path it sets, or the problem with it.
pub(crate) fn check_override(var: &str, value: &str, prefix: &str) -> Result<String, Box<Problem>> {
    let path = var[prefix.len()..].to_ascii_lowercase().replace("__", ".");
    let fail = |kind, message: String| {
        let mut problem = Problem::new(kind, &path, value, message);
        problem.env = Some(var.to_owned());
        Err(Box::new(problem))
    };
    let Some(key) = schema::lookup(&path) else {
        let top = path.split('.').next().unwrap_or_default();
        if schema::lookup(top).is_some_and(|k| k.ty == Type::Entries) {
            return fail(
                ProblemKind::UnknownKey,
                format!("[[{top}]] entries cannot be set from the environment"),
            );
        }
        let (parent, name) = path.rsplit_once('.').unwrap_or(("", &path));
        let hint = schema::suggest(parent, name)
            .map(|s| format!(" (did you mean {}?)", env_name(prefix, &join(parent, s))))
            .unwrap_or_default();
        return fail(ProblemKind::UnknownKey, format!("unknown key{hint}"));
    };
    // As the config crate reads it (`try_parsing`): an integer or a boolean when the text is
    // one, a string otherwise; global.cpus is a comma-separated list.
    let result = match key.ty {
        Type::Section | Type::Entries => Err(format!(
            "a section: set one of its keys, e.g. {}",
            schema::children(key.path)
                .next()
                .map_or_else(String::new, |k| env_name(prefix, k.path))
        )),
        Type::IntList { .. } if key.path == LIST_KEY => value
            .split(',')
            .try_for_each(|item| schema::check_scalar(key.ty, parsed(item.trim()))),
        Type::IntList { .. } | Type::StrList => {
            Err("a list: cannot be set from the environment".to_owned())
        }
        // Strings stay strings even when they look like numbers.
        Type::Str | Type::Path => Ok(()),
        Type::Size | Type::Enum(_) => schema::check_scalar(
            key.ty,
            match parsed(value) {
                Scalar::Int(n) => Scalar::Int(n),
                _ => Scalar::Str(value),
            },
        ),
        _ => schema::check_scalar(key.ty, parsed(value)),
    };
    match result {
        Ok(()) => Ok(path),
        Err(message) => fail(ProblemKind::WrongType, message),
    }
}

fn parsed(text: &str) -> Scalar<'_> {
    if let Ok(n) = text.parse::<i64>() {
        Scalar::Int(n)
    } else if text.to_ascii_lowercase().parse::<bool>().is_ok() {
        Scalar::Bool
    } else {
        Scalar::Str(text)
    }
}

/// The one list key the environment may set (comma-separated).
pub(crate) const LIST_KEY: &str = "global.cpus";

fn env_name(prefix: &str, path: &str) -> String {
    format!("{prefix}{}", path.to_ascii_uppercase().replace('.', "__"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn problems(text: &str) -> Vec<String> {
        match Source::parse("t.toml", text, true) {
            Ok(source) => source.check().iter().map(ToString::to_string).collect(),
            Err(problem) => vec![problem.to_string()],
        }
    }

    #[test]
    fn every_unknown_key_and_wrong_type_is_reported_with_its_position() {
        let text = "[global]\nreactor = 1\nmax_io_queues = \"8\"\n\n[[ports]]\nid = 70000\n\
                    transport = \"udp\"\naddress = \"::1\"\n\n[[subsystems]]\nnqn = \"n\"\n\
                    [[subsystems.namespaces]]\nnsid = 1\nram_size = \"1MB\"\n[bogus]\n";
        assert_eq!(
            problems(text),
            [
                "t.toml:2:1: global.reactor: unknown key (did you mean reactors?)",
                "t.toml:3:17: global.max_io_queues: 8: expected integer, found string",
                "t.toml:6:6: ports[0].id: 70000: 70000 is out of range 0..=65535",
                "t.toml:7:13: ports[0].transport: udp: \"udp\" is not one of \"tcp\", \"rdma\"",
                "t.toml:5:1: ports[0].service: missing key (integer is required)",
                "t.toml:14:12: subsystems[0].namespaces[0].ram_size: 1MB: \"1MB\" is not a \
                 number with an optional K/M/G/T (or KiB/MiB/GiB/TiB) suffix (sizes are \
                 binary: 4096, \"512M\", \"1G\", \"1GiB\"; no decimal KB/MB)",
                "t.toml:15:2: bogus: unknown section",
            ]
        );
    }

    #[test]
    fn a_syntax_error_has_its_position() {
        assert_eq!(
            problems("[global]\nreactors = = 2\n")[0]
                .split(": ")
                .next()
                .unwrap(),
            "t.toml:2:12"
        );
    }

    #[test]
    fn validation_problems_are_placed_at_their_keys() {
        let text = "[[subsystems]]\nnqn = \"a\"\n[[subsystems.namespaces]]\nnsid = 1\n\
                    [[subsystems.namespaces]]\n  nsid = 1\n";
        let source = Source::parse("t.toml", text, true).unwrap();
        let placed = |key: &str| {
            let p = source.place(Problem::new(ProblemKind::Invalid, key, "", "x".into()));
            (p.line, p.column)
        };
        assert_eq!(
            placed("subsystems[0].namespaces[1].nsid"),
            (Some(6), Some(10))
        );
        assert_eq!(placed("subsystems[0].namespaces[1]"), (Some(5), Some(1)));
        assert_eq!(placed("subsystems[0].allow_any_host"), (Some(1), Some(1)));
        assert_eq!(placed("ports"), (None, None));
    }

    #[test]
    fn mistakes_can_be_deleted_to_check_the_rest() {
        let text = "[global]\nreactor = 1\ncpus = [1, \"x\"]\n[[ports]]\nid = 1\nbogus = 2\n\
                    [[ports]]\nid = 2\n";
        let pruned = without_keys(
            text,
            &["global.reactor", "global.cpus[1]", "ports[0].bogus"],
        );
        assert_eq!(
            pruned.as_deref(),
            Some("[global]\n[[ports]]\nid = 1\n[[ports]]\nid = 2\n")
        );
        assert_eq!(without_keys(text, &["ports[5].id"]), None);
    }

    #[test]
    fn overrides_name_their_variable() {
        let check = |var: &str, value: &str| {
            check_override(var, value, "NVMFD_").map_err(|p| p.to_string())
        };
        assert_eq!(
            check("NVMFD_GLOBAL__REACTORS", "3"),
            Ok("global.reactors".into())
        );
        assert_eq!(check("NVMFD_GLOBAL__CPUS", "2,3"), Ok("global.cpus".into()));
        assert_eq!(
            check("NVMFD_GLOBAL__REACTOR", "3"),
            Err(
                "NVMFD_GLOBAL__REACTOR: global.reactor: 3: unknown key (did you mean \
                 NVMFD_GLOBAL__REACTORS?)"
                    .into()
            )
        );
        assert_eq!(
            check("NVMFD_GLOBAL__REACTORS", "many"),
            Err(
                "NVMFD_GLOBAL__REACTORS: global.reactors: many: expected integer, found \
                 string"
                    .into()
            )
        );
        assert!(check("NVMFD_GLOBAL__MAX_DATA_TRANSFER", "1MB").is_err());
        assert!(check("NVMFD_GLOBAL__MAX_DATA_TRANSFER", "1M").is_ok());
        assert!(check("NVMFD_GLOBAL__LOG_FORMAT", "xml").is_err());
        assert!(check("NVMFD_SUBSYSTEMS__NQN", "x").is_err());
        assert!(check("NVMFD_GLOBAL__DISCOVERY_NQN", "x").is_ok());
    }
}

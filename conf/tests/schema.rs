//! The schema table (`conf::schema::KEYS`) is the configuration's single description: these
//! tests hold it equal to what the serde types accept, key for key, and to their defaults, so
//! that a key added to one cannot be missing from the other (nor from the manual page).

use std::cell::RefCell;
use std::collections::BTreeSet;

use conf::schema::{Absent, Type, KEYS};
use conf::Config;
use serde::de::{self, DeserializeSeed, IntoDeserializer, MapAccess, SeqAccess, Visitor};
use serde::Deserialize;

/// A deserializer that makes up a value of every requested shape and records the path of
/// every struct field serde asks for: the keys the loader accepts.
struct Tracer<'a> {
    path: String,
    seen: &'a RefCell<BTreeSet<String>>,
}

type Error = de::value::Error;

fn join(parent: &str, name: &str) -> String {
    if parent.is_empty() {
        name.to_owned()
    } else {
        format!("{parent}.{name}")
    }
}

impl<'de> de::Deserializer<'de> for Tracer<'_> {
    type Error = Error;

    /// Numbers and sizes (`ByteSize` asks for any).
    fn deserialize_any<V: Visitor<'de>>(self, v: V) -> Result<V::Value, Error> {
        v.visit_u64(4096)
    }
    fn deserialize_bool<V: Visitor<'de>>(self, v: V) -> Result<V::Value, Error> {
        v.visit_bool(true)
    }
    fn deserialize_str<V: Visitor<'de>>(self, v: V) -> Result<V::Value, Error> {
        v.visit_str("/x")
    }
    fn deserialize_string<V: Visitor<'de>>(self, v: V) -> Result<V::Value, Error> {
        v.visit_str("/x")
    }
    fn deserialize_option<V: Visitor<'de>>(self, v: V) -> Result<V::Value, Error> {
        v.visit_some(self)
    }
    fn deserialize_newtype_struct<V: Visitor<'de>>(
        self,
        _: &'static str,
        v: V,
    ) -> Result<V::Value, Error> {
        v.visit_newtype_struct(self)
    }
    fn deserialize_seq<V: Visitor<'de>>(self, v: V) -> Result<V::Value, Error> {
        v.visit_seq(One {
            tracer: Some(Tracer {
                path: format!("{}[]", self.path),
                seen: self.seen,
            }),
        })
    }
    fn deserialize_struct<V: Visitor<'de>>(
        self,
        _: &'static str,
        fields: &'static [&'static str],
        v: V,
    ) -> Result<V::Value, Error> {
        for field in fields {
            self.seen.borrow_mut().insert(join(&self.path, field));
        }
        v.visit_map(Fields {
            fields,
            next: 0,
            path: self.path,
            seen: self.seen,
        })
    }
    fn deserialize_enum<V: Visitor<'de>>(
        self,
        _: &'static str,
        variants: &'static [&'static str],
        v: V,
    ) -> Result<V::Value, Error> {
        v.visit_enum(variants[0].into_deserializer())
    }

    serde::forward_to_deserialize_any! {
        i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char bytes byte_buf unit unit_struct
        tuple tuple_struct map identifier ignored_any
    }
}

struct One<'a> {
    tracer: Option<Tracer<'a>>,
}

impl<'de> SeqAccess<'de> for One<'_> {
    type Error = Error;
    fn next_element_seed<T: DeserializeSeed<'de>>(
        &mut self,
        seed: T,
    ) -> Result<Option<T::Value>, Error> {
        self.tracer.take().map(|t| seed.deserialize(t)).transpose()
    }
}

struct Fields<'a> {
    fields: &'static [&'static str],
    next: usize,
    path: String,
    seen: &'a RefCell<BTreeSet<String>>,
}

impl<'de> MapAccess<'de> for Fields<'_> {
    type Error = Error;
    fn next_key_seed<K: DeserializeSeed<'de>>(
        &mut self,
        seed: K,
    ) -> Result<Option<K::Value>, Error> {
        let Some(field) = self.fields.get(self.next) else {
            return Ok(None);
        };
        self.next += 1;
        seed.deserialize(field.into_deserializer()).map(Some)
    }
    fn next_value_seed<V: DeserializeSeed<'de>>(&mut self, seed: V) -> Result<V::Value, Error> {
        seed.deserialize(Tracer {
            path: join(&self.path, self.fields[self.next - 1]),
            seen: self.seen,
        })
    }
}

#[test]
fn every_key_the_loader_accepts_is_in_the_schema_and_no_other() {
    let seen = RefCell::new(BTreeSet::new());
    Config::deserialize(Tracer {
        path: String::new(),
        seen: &seen,
    })
    .expect("the tracer makes up a value of every shape");
    let accepted = seen.into_inner();
    let documented: BTreeSet<String> = KEYS.iter().map(|k| k.path.to_owned()).collect();
    let missing: Vec<_> = accepted.difference(&documented).collect();
    let extra: Vec<_> = documented.difference(&accepted).collect();
    assert!(
        missing.is_empty() && extra.is_empty(),
        "accepted but not in conf::schema::KEYS: {missing:?}; in KEYS but not accepted: {extra:?}"
    );
}

/// A value of `ty` that parses (not necessarily one that validates).
fn sample(ty: Type) -> toml::Value {
    match ty {
        Type::Bool => toml::Value::Boolean(true),
        Type::Int { min, .. } => toml::Value::Integer(min.max(1)),
        Type::Size => toml::Value::String("4K".into()),
        Type::Str => toml::Value::String("x".into()),
        Type::Path => toml::Value::String("/x".into()),
        Type::Enum(names) => toml::Value::String(names[0].into()),
        Type::IntList { min, .. } => toml::Value::Array(vec![toml::Value::Integer(min.max(1))]),
        Type::StrList => toml::Value::Array(vec![toml::Value::String("x".into())]),
        Type::Section => toml::Value::Table(toml::Table::new()),
        Type::Entries => toml::Value::Array(vec![toml::Value::Table(toml::Table::new())]),
    }
}

/// Sets `path` (`a[].b`: in the first entry of `a`) in `table`, creating what is missing.
fn insert(table: &mut toml::Table, path: &str, value: toml::Value) {
    let (head, rest) = match path.split_once('.') {
        Some((head, rest)) => (head, Some(rest)),
        None => (path, None),
    };
    let (name, entry) = match head.strip_suffix("[]") {
        Some(name) => (name, true),
        None => (head, false),
    };
    let Some(rest) = rest else {
        table.insert(name.to_owned(), value);
        return;
    };
    let slot = table.entry(name.to_owned()).or_insert_with(|| {
        if entry {
            toml::Value::Array(vec![toml::Value::Table(toml::Table::new())])
        } else {
            toml::Value::Table(toml::Table::new())
        }
    });
    let inner = match slot {
        toml::Value::Array(entries) => entries[0].as_table_mut().unwrap(),
        toml::Value::Table(t) => t,
        other => panic!("{path}: {other:?} in the way"),
    };
    insert(inner, rest, value);
}

#[test]
fn every_key_of_the_schema_parses_with_a_value_of_its_type() {
    let mut doc = toml::Table::new();
    for key in KEYS {
        insert(&mut doc, key.path, sample(key.ty));
    }
    let text = toml::to_string(&doc).unwrap();
    // The serde types (unknown keys refused) and the schema checks agree on the whole file.
    toml::from_str::<Config>(&text).unwrap_or_else(|e| panic!("{e}\n{text}"));
    Config::parse_toml(&text).unwrap_or_else(|e| panic!("{e}\n{text}"));
}

#[test]
fn defaults_in_the_schema_are_the_loaders() {
    // One entry of each kind with only its required keys; everything else at its default.
    let mut doc = toml::Table::new();
    for key in KEYS {
        if key.default == Absent::Required && key.path.contains("[]") {
            insert(&mut doc, key.path, sample(key.ty));
        }
    }
    // An optional section those entries brought in (`[gateway_group]` with its members)
    // needs its own required keys too.
    for key in KEYS {
        let section = key.path.split(['.', '[']).next().unwrap_or_default();
        if key.default == Absent::Required
            && !key.path.contains("[]")
            && key.path.contains('.')
            && key.ty != Type::Entries
            && doc.contains_key(section)
        {
            insert(&mut doc, key.path, sample(key.ty));
        }
    }
    let text = toml::to_string(&doc).unwrap();
    let config = Config::parse_toml(&text).unwrap_or_else(|e| panic!("{e}\n{text}"));
    let mut written: toml::Table = toml::from_str(&toml::to_string(&config).unwrap()).unwrap();
    // Sections left out when at their defaults, written out whole.
    let rdma = toml::Value::try_from(conf::Rdma::default()).unwrap();
    let metrics = toml::Value::try_from(conf::Metrics::default()).unwrap();
    written.insert("rdma".into(), rdma);
    written.insert("metrics".into(), metrics);
    let mut compared = 0;
    for key in KEYS {
        let Absent::Value(default) = key.default else {
            continue;
        };
        if key.ty == Type::Entries {
            continue; // the entries made above
        }
        let mut value = Some(toml::Value::Table(written.clone()));
        for part in key.path.split('.') {
            let (name, entry) = match part.strip_suffix("[]") {
                Some(name) => (name, true),
                None => (part, false),
            };
            value = value
                .as_ref()
                .and_then(|v| v.get(name))
                .and_then(|v| if entry { v.get(0) } else { Some(v) })
                .cloned();
        }
        // Keys left out of the written file at their default (`skip_serializing_if`).
        let Some(value) = value else { continue };
        let shown = match &value {
            toml::Value::String(s) => s.clone(),
            other => other.to_string(),
        };
        assert_eq!(shown, default, "default of {}", key.path);
        compared += 1;
    }
    assert!(compared >= 27, "only {compared} defaults compared");
}

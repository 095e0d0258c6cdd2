//! The command-line flags of `larder serve`, one per option of [`OPTIONS`] (except the TOML-only
//! lists of tables), derived from the declaration: `block_size` is `--block-size`, its help
//! the first sentence of its documentation and its default.
//!
//! A flag's value is read the way a `LARDER_*` variable's is (figment's `Value` parser) and laid
//! over the other layers, so a flag and its variable accept exactly the same text.

use figment::value::{Dict, Value};
use serde::Serialize;

use super::{Config, FlagKind, OPTIONS};

/// The flags given on a command line: option name to value, only those given.
#[derive(Debug, Default, Clone, Serialize)]
#[serde(transparent)]
pub struct Flags(Dict);

/// `block_size` → `block-size`.
fn flag_name(option: &str) -> String {
    option.replace('_', "-")
}

/// The documentation's first sentence, and the default as the TOML file would write it.
fn help(doc: &str, default: Option<&toml::Value>) -> String {
    let text = doc.split('\n').map(str::trim).collect::<Vec<_>>().join(" ");
    let first = match text.find(". ") {
        Some(end) => &text[..=end],
        None => text.as_str(),
    };
    match default {
        Some(toml::Value::String(s)) => format!("{first} [default: {s}]"),
        Some(toml::Value::Array(a)) if a.is_empty() => format!("{first} [default: none]"),
        Some(v) => format!("{first} [default: {v}]"),
        None => format!("{first} [default: none]"),
    }
}

impl clap::Args for Flags {
    fn augment_args(cmd: clap::Command) -> clap::Command {
        let defaults = toml::Value::try_from(Config::default()).expect("defaults serialize");
        OPTIONS
            .iter()
            .filter(|o| o.flag != FlagKind::TomlOnly)
            .fold(cmd, |cmd, o| {
                let arg = clap::Arg::new(o.name)
                    .long(flag_name(o.name))
                    .value_name("VALUE")
                    .help(help(o.doc, defaults.get(o.name)));
                cmd.arg(match o.flag {
                    FlagKind::List => arg.value_delimiter(',').num_args(1..),
                    FlagKind::Switch => arg.num_args(0..=1).default_missing_value("true"),
                    FlagKind::Value | FlagKind::TomlOnly => arg,
                })
            })
    }

    fn augment_args_for_update(cmd: clap::Command) -> clap::Command {
        Self::augment_args(cmd)
    }
}

impl clap::FromArgMatches for Flags {
    fn from_arg_matches(matches: &clap::ArgMatches) -> Result<Self, clap::Error> {
        let mut given = Dict::new();
        for o in OPTIONS.iter().filter(|o| o.flag != FlagKind::TomlOnly) {
            let Some(mut values) = matches.get_many::<String>(o.name) else {
                continue;
            };
            let value = match o.flag {
                FlagKind::List => Value::from(values.cloned().collect::<Vec<String>>()),
                _ => match values.next_back() {
                    // Infallible: text that is no number, bool or list stays text.
                    Some(text) => text.parse::<Value>().unwrap_or_else(|e| match e {}),
                    None => continue,
                },
            };
            given.insert(o.name.to_owned(), value);
        }
        Ok(Flags(given))
    }

    fn update_from_arg_matches(&mut self, matches: &clap::ArgMatches) -> Result<(), clap::Error> {
        *self = Self::from_arg_matches(matches)?;
        Ok(())
    }
}

#[cfg(test)]
impl Flags {
    /// The flags of the command line `args` (without the program name).
    pub(crate) fn parse<'a>(args: impl IntoIterator<Item = &'a str>) -> Self {
        use clap::{Args, FromArgMatches};
        let cmd = Self::augment_args(clap::Command::new("larder"));
        let matches = cmd
            .try_get_matches_from(std::iter::once("larder").chain(args))
            .expect("flags parse");
        Self::from_arg_matches(&matches).expect("flags read")
    }
}

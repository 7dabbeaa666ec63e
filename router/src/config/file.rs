//! The optional TOML config file, turned into flag arguments.
//!
//! Each key is a long flag name, so clap validates file values exactly as it
//! validates flags and there is no second parser to drift. Values from the
//! file go before the command line (later flags win); a key whose `SHOAL_*`
//! variable is set is skipped, so the environment beats the file.

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use clap::{ArgAction, Command};

/// A config file that could not be used; every variant names the file.
#[derive(Debug, thiserror::Error)]
pub enum FileError {
    /// The file could not be read.
    #[error("config file {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// Why reading failed.
        source: std::io::Error,
    },
    /// The file is not valid TOML.
    #[error("config file {path}: {message}")]
    Syntax {
        /// The file.
        path: PathBuf,
        /// The TOML parser's message.
        message: String,
    },
    /// A key that is not a flag, or a value of a type no flag takes.
    #[error("config file {path}: key `{key}`: {message}")]
    Key {
        /// The file.
        path: PathBuf,
        /// The offending key.
        key: String,
        /// What is wrong with it.
        message: String,
    },
}

/// Reads `path` and returns the equivalent `--flag value` arguments.
pub fn args_from_file(path: &Path, command: &Command) -> Result<Vec<OsString>, FileError> {
    let text = std::fs::read_to_string(path).map_err(|source| FileError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    let table: toml::Table = text
        .parse()
        .map_err(|err: toml::de::Error| FileError::Syntax {
            path: path.to_path_buf(),
            message: err.message().to_string(),
        })?;
    let key_error = |key: &str, message: String| FileError::Key {
        path: path.to_path_buf(),
        key: key.to_string(),
        message,
    };

    let mut args = Vec::new();
    for (key, value) in &table {
        let long = key.replace('_', "-");
        let arg = command
            .get_arguments()
            .find(|arg| arg.get_long() == Some(long.as_str()))
            .filter(|_| long != "config" && long != "help" && long != "version")
            .ok_or_else(|| key_error(key, "not a shoal setting".into()))?;
        let env_overrides = arg
            .get_env()
            .is_some_and(|name| std::env::var_os(name).is_some());
        if env_overrides {
            continue;
        }
        let flag = format!("--{long}");
        match (arg.get_action(), value) {
            (ArgAction::SetTrue, toml::Value::Boolean(on)) => {
                if *on {
                    args.push(OsString::from(flag));
                }
            }
            (ArgAction::SetTrue, _) => return Err(key_error(key, "expects true or false".into())),
            (_, toml::Value::Array(items)) => {
                args.push(OsString::from(&flag));
                for item in items {
                    args.push(scalar(item).map_err(|m| key_error(key, m))?);
                }
            }
            (_, other) => {
                args.push(OsString::from(format!(
                    "{flag}={}",
                    scalar(other)
                        .map_err(|m| key_error(key, m))?
                        .to_string_lossy()
                )));
            }
        }
    }
    Ok(args)
}

fn scalar(value: &toml::Value) -> Result<OsString, String> {
    match value {
        toml::Value::String(text) => Ok(text.into()),
        toml::Value::Integer(n) => Ok(n.to_string().into()),
        toml::Value::Float(x) => Ok(x.to_string().into()),
        toml::Value::Boolean(b) => Ok(b.to_string().into()),
        _ => Err("expects a string, number, boolean or a list of them".into()),
    }
}

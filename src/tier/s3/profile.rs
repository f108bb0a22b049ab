//! Credentials from the AWS shared files, where `object_store` reads only
//! the environment: the credentials file (`AWS_SHARED_CREDENTIALS_FILE`,
//! default `~/.aws/credentials`, sections `[NAME]`) and the config file
//! (`AWS_CONFIG_FILE`, default `~/.aws/config`, sections `[profile NAME]`
//! and `[default]`), for the profile `AWS_PROFILE` (default `default`):
//! `aws_access_key_id`, `aws_secret_access_key`, `aws_session_token`, and
//! the config file's `region`. The credentials file wins over the config
//! file, key by key, as the AWS SDKs have it.
//!
//! The files are read as the SDKs read them: `[section]` lines, `key =
//! value` lines (whitespace around both trimmed), `#` and `;` comments on
//! their own lines; anything else is skipped. A file that cannot be read
//! counts as empty (most machines have none). Values are never logged.

use std::path::{Path, PathBuf};

/// What a profile holds.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct Profile {
    /// `aws_access_key_id`.
    pub access_key_id: Option<String>,
    /// `aws_secret_access_key`.
    pub secret_access_key: Option<String>,
    /// `aws_session_token`.
    pub session_token: Option<String>,
    /// `region` (the config file's).
    pub region: Option<String>,
}

impl std::fmt::Debug for Profile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Profile")
            .field("access_key_id", &self.access_key_id)
            .field(
                "secret_access_key",
                &self.secret_access_key.as_ref().map(|_| "<redacted>"),
            )
            .field(
                "session_token",
                &self.session_token.as_ref().map(|_| "<redacted>"),
            )
            .field("region", &self.region)
            .finish()
    }
}

/// The largest file read: a credentials file is a few lines.
const MAX_FILE: u64 = 1 << 20;

/// The entries of `section` in an AWS shared file's text, in order; `None`
/// when the section is not there.
///
/// ```
/// use kvtier::tier::aws_file_section;
///
/// let text = "# keys\n[default]\naws_access_key_id = AKID\n\n[profile fleet]\nregion=eu-west-1\n";
/// assert_eq!(aws_file_section(text, "default"), Some(vec![("aws_access_key_id".into(), "AKID".into())]));
/// assert_eq!(aws_file_section(text, "profile fleet"), Some(vec![("region".into(), "eu-west-1".into())]));
/// assert_eq!(aws_file_section(text, "other"), None);
/// ```
pub fn aws_file_section(text: &str, section: &str) -> Option<Vec<(String, String)>> {
    let mut found: Option<Vec<(String, String)>> = None;
    let mut inside = false;
    for line in text.lines() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') || line.starts_with(';') {
            continue;
        }
        if let Some(name) = line
            .strip_prefix('[')
            .and_then(|rest| rest.strip_suffix(']'))
        {
            // guard: O18-a-profile-is-its-own-section
            inside = name.trim() == section;
            if inside {
                found.get_or_insert_with(Vec::new);
            }
            continue;
        }
        if !inside {
            continue;
        }
        if let (Some(entries), Some((key, value))) = (&mut found, line.split_once('=')) {
            entries.push((key.trim().to_owned(), value.trim().to_owned()));
        }
    }
    found
}

/// The profile `name` from the credentials file's text and the config
/// file's (either may be empty): the credentials file's entries first.
pub(crate) fn profile_from(credentials: &str, config: &str, name: &str) -> Profile {
    let config_section = if name == "default" {
        "default".to_owned()
    } else {
        format!("profile {name}")
    };
    let mut profile = Profile::default();
    let sections = [
        aws_file_section(credentials, name),
        aws_file_section(config, &config_section),
    ];
    for (key, value) in sections.into_iter().flatten().flatten() {
        let slot = match key.as_str() {
            "aws_access_key_id" => &mut profile.access_key_id,
            "aws_secret_access_key" => &mut profile.secret_access_key,
            "aws_session_token" => &mut profile.session_token,
            "region" => &mut profile.region,
            _ => continue,
        };
        if slot.is_none() && !value.is_empty() {
            *slot = Some(value);
        }
    }
    profile
}

/// The environment's profile (see the module docs); `None` when neither
/// file names it.
pub(crate) fn environment_profile() -> Option<Profile> {
    let home = std::env::var_os("HOME").map(PathBuf::from);
    let path = |variable: &str, default: &str| {
        std::env::var_os(variable)
            .map(PathBuf::from)
            .or_else(|| home.as_ref().map(|home| home.join(default)))
    };
    let read = |path: Option<PathBuf>| path.and_then(|path| read_small(&path)).unwrap_or_default();
    let credentials = read(path("AWS_SHARED_CREDENTIALS_FILE", ".aws/credentials"));
    let config = read(path("AWS_CONFIG_FILE", ".aws/config"));
    let name = std::env::var("AWS_PROFILE").unwrap_or_else(|_| "default".to_owned());
    let profile = profile_from(&credentials, &config, &name);
    (profile != Profile::default()).then_some(profile)
}

/// A file's text, if it is at most [`MAX_FILE`] bytes and readable.
fn read_small(path: &Path) -> Option<String> {
    let metadata = std::fs::metadata(path).ok()?;
    if !metadata.is_file() || metadata.len() > MAX_FILE {
        return None;
    }
    std::fs::read_to_string(path).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    const CREDENTIALS: &str = "\
[default]
aws_access_key_id = AKIDDEFAULT
aws_secret_access_key = secret-default

; the fleet's keys
[fleet]
aws_access_key_id=AKIDFLEET
aws_secret_access_key = secret-fleet
aws_session_token = token-fleet
";

    const CONFIG: &str = "\
[default]
region = us-east-2

[profile fleet]
region = eu-west-1
aws_access_key_id = AKIDFROMCONFIG

[fleet]
region = wrong-section
";

    #[test]
    fn a_named_profile_takes_its_sections_and_the_credentials_file_first() {
        let fleet = profile_from(CREDENTIALS, CONFIG, "fleet");
        assert_eq!(fleet.access_key_id.as_deref(), Some("AKIDFLEET"));
        assert_eq!(fleet.secret_access_key.as_deref(), Some("secret-fleet"));
        assert_eq!(fleet.session_token.as_deref(), Some("token-fleet"));
        assert_eq!(
            fleet.region.as_deref(),
            Some("eu-west-1"),
            "`[profile fleet]`, not `[fleet]`"
        );
        let default = profile_from(CREDENTIALS, CONFIG, "default");
        assert_eq!(default.access_key_id.as_deref(), Some("AKIDDEFAULT"));
        assert_eq!(default.region.as_deref(), Some("us-east-2"));
        assert_eq!(
            profile_from(CREDENTIALS, CONFIG, "missing"),
            Profile::default()
        );
        assert_eq!(profile_from("", "", "default"), Profile::default());
    }

    #[test]
    fn a_secret_is_not_shown() {
        let shown = format!("{:?}", profile_from(CREDENTIALS, CONFIG, "fleet"));
        assert!(
            shown.contains("AKIDFLEET")
                && !shown.contains("secret-fleet")
                && !shown.contains("token-fleet")
        );
    }

    #[test]
    fn odd_lines_are_skipped_not_fatal() {
        let text = "[default\n=novalue\nkey without equals\n[default]\n x = = y \n[]\n";
        assert_eq!(
            aws_file_section(text, "default"),
            Some(vec![("x".into(), "= y".into())])
        );
    }
}

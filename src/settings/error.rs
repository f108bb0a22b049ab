//! The error of a setting out of its range or of the wrong kind.

/// A setting refused: which one (as the caller wrote it) and why. Its
/// message reads "`<setting>` is ...; it must be ...".
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{setting} {problem}")]
pub struct SettingError {
    /// The setting, as the caller wrote it (`capacity_bytes`,
    /// `kv_connector_extra_config['capacity_bytes']`, `--capacity`).
    pub setting: String,
    /// What is wrong with its value, starting with "is".
    pub problem: String,
}

impl SettingError {
    /// Setting `setting` refused: `problem` starts with "is".
    pub fn new(setting: impl Into<String>, problem: impl Into<String>) -> Self {
        Self {
            setting: setting.into(),
            problem: problem.into(),
        }
    }

    /// The same error, naming the setting `spelled` (how a layer above
    /// calls it).
    pub fn spelled(self, spelled: impl Into<String>) -> Self {
        Self {
            setting: spelled.into(),
            problem: self.problem,
        }
    }
}

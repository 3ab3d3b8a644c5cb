//! NVIDIA driver versions as the driver reports them (`/proc/driver/nvidia/version`,
//! `nvidia-smi`) and as NVIDIA tags its releases: `535.104.05`, `535.98`, `590.48.01`.

use std::fmt;
use std::str::FromStr;

/// A driver version: `MAJOR.MINOR[.PATCH]`. Ordered by its numbers (`535.98 < 535.104.05 <
/// 550.54.14`); a version without a patch sorts before the same one with any patch.
/// Displayed as NVIDIA writes it: the patch, when there is one, with two digits at least
/// (`535.104.05`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct DriverVersion {
    /// The branch: 535, 550, 590, ...
    pub major: u32,
    pub minor: u32,
    pub patch: Option<u32>,
}

/// Why a string is not a driver version.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ParseVersionError(String);

impl fmt::Display for ParseVersionError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{:?} is not a driver version (MAJOR.MINOR[.PATCH], e.g. 535.104.05)",
            self.0
        )
    }
}

impl std::error::Error for ParseVersionError {}

impl DriverVersion {
    /// A version from its numbers.
    pub const fn new(major: u32, minor: u32, patch: Option<u32>) -> DriverVersion {
        DriverVersion {
            major,
            minor,
            patch,
        }
    }
}

impl FromStr for DriverVersion {
    type Err = ParseVersionError;

    /// `535.104.05`, `535.98`, `590.48.01` (surrounding whitespace ignored); digits only, two
    /// or three parts.
    fn from_str(s: &str) -> Result<DriverVersion, ParseVersionError> {
        let err = || ParseVersionError(s.to_string());
        let mut nums = [0u32; 3];
        let mut n = 0;
        for part in s.trim().split('.') {
            if n == 3
                || part.is_empty()
                || part.len() > 9
                || !part.bytes().all(|b| b.is_ascii_digit())
            {
                return Err(err());
            }
            nums[n] = part.parse().map_err(|_| err())?;
            n += 1;
        }
        match n {
            2 => Ok(DriverVersion::new(nums[0], nums[1], None)),
            3 => Ok(DriverVersion::new(nums[0], nums[1], Some(nums[2]))),
            _ => Err(err()),
        }
    }
}

impl fmt::Display for DriverVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.major, self.minor)?;
        if let Some(p) = self.patch {
            write!(f, ".{p:02}")?;
        }
        Ok(())
    }
}

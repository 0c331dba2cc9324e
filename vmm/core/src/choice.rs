//! Settings that take one of a few names (`--policy tpp`, `--placement
//! slow-first`, ...): the [`Choice`] trait, and the [`choices!`] macro that
//! defines such an enum with each variant's name and help written once.
//!
//! The core does not depend on a command-line parser: the binary builds its
//! parser from [`Choice::ALL`], [`Choice::name`] and [`Choice::help`], and the
//! service parses names with [`FromStr`](std::str::FromStr).

/// An enum whose values are named (the command line's, the API's and the
/// report's names are the same).
pub trait Choice: Copy + 'static {
    /// What a value is, for messages (`policy`, `placement`).
    const WHAT: &'static str;
    /// Every value, in the order help lists them.
    const ALL: &'static [Self];

    /// The value's name.
    fn name(self) -> &'static str;

    /// One line on what the value means (`--help`'s "Possible values").
    fn help(self) -> &'static str;

    /// The value called `name`, ignoring ASCII case if `ignore_case`.
    fn from_name(name: &str, ignore_case: bool) -> Option<Self> {
        Self::ALL.iter().copied().find(|v| {
            if ignore_case {
                v.name().eq_ignore_ascii_case(name)
            } else {
                v.name() == name
            }
        })
    }
}

/// A name that is none of a [`Choice`]'s values.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("unknown {what} '{name}': valid values are {}", .valid.join(", "))]
pub struct UnknownChoice {
    /// What a value is (`policy`).
    pub what: &'static str,
    /// The name given.
    pub name: String,
    /// The valid names.
    pub valid: Vec<&'static str>,
}

impl UnknownChoice {
    /// `name` is none of `T`'s values.
    pub fn of<T: Choice>(name: &str) -> Self {
        Self {
            what: T::WHAT,
            name: name.into(),
            valid: T::ALL.iter().map(|v| v.name()).collect(),
        }
    }
}

/// Defines an enum whose variants are named, each with a help line:
/// `Variant = "name": "help"`. The help is also the variant's doc comment,
/// the name also its serde name. Implements [`Choice`], `FromStr` (exact
/// names; the error lists the valid ones), `Display` (the name), and serde
/// both ways as the name (deserialising through `FromStr`, so an unknown
/// name fails with [`UnknownChoice`]'s message).
macro_rules! choices {
    ($(
        $(#[$meta:meta])*
        $vis:vis enum $ty:ident ($what:literal) {
            $($variant:ident = $name:literal : $help:literal,)+
        }
    )+) => {$(
        $(#[$meta])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
        $vis enum $ty {
            $(
                #[doc = $help]
                #[serde(rename = $name)]
                $variant,
            )+
        }

        impl $crate::choice::Choice for $ty {
            const WHAT: &'static str = $what;
            const ALL: &'static [Self] = &[$(Self::$variant),+];

            fn name(self) -> &'static str {
                match self {
                    $(Self::$variant => $name,)+
                }
            }

            fn help(self) -> &'static str {
                match self {
                    $(Self::$variant => $help,)+
                }
            }
        }

        impl std::str::FromStr for $ty {
            type Err = $crate::choice::UnknownChoice;

            fn from_str(s: &str) -> Result<Self, Self::Err> {
                <Self as $crate::choice::Choice>::from_name(s, false)
                    .ok_or_else(|| $crate::choice::UnknownChoice::of::<Self>(s))
            }
        }

        impl<'de> serde::Deserialize<'de> for $ty {
            fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                let name = <String as serde::Deserialize>::deserialize(d)?;
                name.parse().map_err(serde::de::Error::custom)
            }
        }

        impl std::fmt::Display for $ty {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str($crate::choice::Choice::name(*self))
            }
        }
    )+};
}

pub(crate) use choices;

#[cfg(test)]
mod tests {
    use super::*;

    choices! {
        /// A test enum.
        enum Color ("color") {
            Red = "red": "The colour of fire",
            DarkBlue = "dark-blue": "The colour of the sea",
        }
    }

    #[test]
    fn names_parse_print_and_list_the_valid_ones() {
        assert_eq!(Color::ALL, &[Color::Red, Color::DarkBlue]);
        assert_eq!("dark-blue".parse::<Color>(), Ok(Color::DarkBlue));
        assert_eq!(Color::DarkBlue.to_string(), "dark-blue");
        assert_eq!(Color::Red.help(), "The colour of fire");
        assert_eq!(Color::from_name("RED", true), Some(Color::Red));
        assert_eq!(Color::from_name("RED", false), None);
        let e = "Red".parse::<Color>().unwrap_err();
        assert_eq!(
            e.to_string(),
            "unknown color 'Red': valid values are red, dark-blue"
        );
        assert_eq!(
            serde_json::to_string(&Color::DarkBlue).unwrap(),
            "\"dark-blue\""
        );
        assert_eq!(
            serde_json::from_str::<Color>("\"dark-blue\"").unwrap(),
            Color::DarkBlue
        );
        let e = serde_json::from_str::<Color>("\"Red\"").unwrap_err();
        assert!(
            e.to_string()
                .starts_with("unknown color 'Red': valid values are red, dark-blue"),
            "{e}"
        );
    }
}

//! clap's parser of the core's named settings ([`Choice`]: `--policy`,
//! `--placement`, ...): the core does not depend on clap, so the binary
//! builds the possible values, with their help, from the trait.

use std::ffi::OsStr;
use std::marker::PhantomData;

use clap::builder::{PossibleValue, PossibleValuesParser, TypedValueParser};
use clap::error::ErrorKind;
use vmm_core::choice::Choice;

/// The value parser of a [`Choice`]: its names, listed with their help in
/// `--help`'s "Possible values", and clap's error (with suggestions) for
/// any other value. `#[arg(value_parser = choice::<PolicyArg>())]`.
pub fn choice<T: Choice>() -> ChoiceParser<T> {
    ChoiceParser(PhantomData)
}

/// See [`choice`].
#[derive(Clone, Copy, Debug)]
pub struct ChoiceParser<T>(PhantomData<T>);

fn possible_value<T: Choice>(v: &T) -> PossibleValue {
    PossibleValue::new(v.name()).help(v.help())
}

impl<T: Choice + Send + Sync> TypedValueParser for ChoiceParser<T> {
    type Value = T;

    fn parse_ref(
        &self,
        cmd: &clap::Command,
        arg: Option<&clap::Arg>,
        value: &OsStr,
    ) -> Result<T, clap::Error> {
        let names = PossibleValuesParser::new(T::ALL.iter().map(possible_value));
        let name = names.parse_ref(cmd, arg, value)?;
        let ignore_case = arg.is_some_and(clap::Arg::is_ignore_case_set);
        // Found: the parser accepted one of these names.
        T::from_name(&name, ignore_case).ok_or_else(|| clap::Error::new(ErrorKind::InvalidValue))
    }

    fn possible_values(&self) -> Option<Box<dyn Iterator<Item = PossibleValue> + '_>> {
        Some(Box::new(T::ALL.iter().map(possible_value)))
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;
    use vmm_core::tiering_config::{PolicyArg, UnitArg};

    use super::*;

    #[derive(Parser)]
    struct Cli {
        #[arg(long, value_parser = choice::<PolicyArg>())]
        policy: Option<PolicyArg>,
        #[arg(long, value_parser = choice::<UnitArg>(), default_value_t = UnitArg::Run2m)]
        unit: UnitArg,
    }

    #[test]
    fn parses_the_names_and_rejects_others_listing_them() {
        let c = Cli::try_parse_from(["t", "--policy", "tpp", "--unit", "4k"]).unwrap();
        assert_eq!(c.policy, Some(PolicyArg::Tpp));
        assert_eq!(c.unit, UnitArg::Page4k);
        let c = Cli::try_parse_from(["t"]).unwrap();
        assert_eq!((c.policy, c.unit), (None, UnitArg::Run2m));
        let e = Cli::try_parse_from(["t", "--policy", "TPP"]).err().unwrap();
        assert_eq!(e.kind(), ErrorKind::InvalidValue);
        let e = e.to_string();
        let listed =
            "[possible values: none, static, chaos, tpp, nomad, memtis, colloid, mtm, adaptive]";
        assert!(
            e.contains("invalid value 'TPP' for '--policy <POLICY>'") && e.contains(listed),
            "{e}"
        );
    }
}

harvest\.rs:345:39: replace \* with / in DirtyHarvester::clear_ranges$

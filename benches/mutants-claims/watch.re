watch\.rs:282:9: replace TieredMemory::wake_all with \(\)$

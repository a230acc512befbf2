"""RocketMQ formats, each implemented once: record codec, properties, segment walk,
ConsumeQueue unit, IndexFile, Java hash, offsetMsgId, UNIQ_KEY."""

# The folder formats/ is installed as quarry.formats only: one module, one name.
if __name__ != "quarry.formats":
    raise ImportError("import quarry.formats, not formats: Quarry installs one top-level package, quarry")

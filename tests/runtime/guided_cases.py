"""The schema set guided decoding is held to: nested objects, arrays, enums, numbers, patterned strings."""

SCHEMAS = {
    "nested": {
        "type": "object",
        "properties": {
            "user": {
                "type": "object",
                "properties": {
                    "id": {"type": "integer", "minimum": 0, "maximum": 999},
                    "role": {"enum": ["admin", "dev", "ops"]},
                },
                "required": ["id", "role"],
                "additionalProperties": False,
            }
        },
        "required": ["user"],
        "additionalProperties": False,
    },
    "array": {
        "type": "object",
        "properties": {
            "scores": {
                "type": "array",
                "items": {"type": "integer", "minimum": 0, "maximum": 9},
                "minItems": 1,
                "maxItems": 4,
            }
        },
        "required": ["scores"],
        "additionalProperties": False,
    },
    "enum": {
        "type": "object",
        "properties": {"color": {"enum": ["red", "green", "blue"]}, "ok": {"type": "boolean"}},
        "required": ["color", "ok"],
        "additionalProperties": False,
    },
    "number": {
        "type": "object",
        "properties": {"x": {"type": "number"}, "n": {"type": "integer"}},
        "required": ["x", "n"],
        "additionalProperties": False,
    },
    "pattern": {
        "type": "object",
        "properties": {
            "code": {"type": "string", "pattern": "^[A-Z]{2}-[0-9]{3}$"},
            "name": {"type": "string", "pattern": "^[a-z]{1,8}$"},
        },
        "required": ["code", "name"],
        "additionalProperties": False,
    },
}

PROMPTS = ["The quick brown fox", '{"name": "fastpath"', "Decode steps replay CUDA graphs", "[1, 2, 3"]

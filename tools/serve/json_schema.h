// JSON schema -> GBNF, as llama.cpp's json-schema-to-grammar writes it (the
// same rule names, the same SPACE_RULE whitespace, rules sorted by name), for
// the subset OpenAI clients send: type (object, array, string, number,
// integer, boolean, null, or a list of them), properties + required
// (optional properties may be absent; properties in declared order),
// additionalProperties (false, true or a schema), items (a schema or a
// tuple), minItems / maxItems, minLength / maxLength, enum, const, anyOf /
// oneOf, $ref to #/$defs/... and #/definitions/... (or any pointer into the
// schema), string formats date, time, date-time and uuid; {} and
// {"type": "object"} accept any JSON object (response_format json_object).
//
// Annotations (title, description, default, examples, $schema, $id,
// $comment, deprecated, readOnly, writeOnly, unknown formats) are ignored.
// A keyword that constrains values in a way the grammar cannot express
// (multipleOf, pattern, minimum, maximum, uniqueItems, not, if/then/else,
// allOf, patternProperties, ...) is refused, never silently dropped: the
// error names the JSON pointer of the schema that holds it
// ("/properties/age: keyword 'multipleOf' is not supported").
#ifndef VELA_TOOLS_SERVE_JSON_SCHEMA_H
#define VELA_TOOLS_SERVE_JSON_SCHEMA_H

#include <stddef.h>

#include <cjson/cJSON.h>

#include "gguf/verr.h"

// The grammar (malloc'd, NUL-terminated; its start rule is "root") of
// schema. VERR_UNSUPPORTED: a keyword or reference it cannot express;
// VERR_FORMAT: a schema that is not one (a keyword of the wrong type).
int json_schema_to_gbnf(const cJSON *schema, char **gbnf, struct verr *err);
// As json_schema_to_gbnf on the JSON text[0..len); VERR_FORMAT when it does not parse.
int json_schema_text_to_gbnf(const char *text, size_t len, char **gbnf, struct verr *err);

#endif

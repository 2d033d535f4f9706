// tools/serve/json_schema: JSON schema -> GBNF as llama.cpp writes it (exact text
// for a small object, whitespace rule included), then the grammars of a set
// of schemas checked on JSON texts that must and must not match, and the
// errors that name the JSON pointer of what cannot be expressed.
#include <criterion/criterion.h>
#include <stdio.h>

#include "tests/grammar_helpers.h"
#include "tools/serve/json_schema.h"

static char *convert(const char *schema) {
    char *g = NULL;
    struct verr err = {0};
    cr_assert_eq(json_schema_text_to_gbnf(schema, strlen(schema), &g, &err), 0, "%s: %s", schema,
                 err.msg);
    return g;
}

// The grammar of schema, parsed.
static struct grammar *schema_grammar(const char *schema) {
    char *text = convert(schema);
    struct grammar *g = NULL;
    struct verr err = {0};
    cr_assert_eq(grammar_parse(&g, text, strlen(text), NULL, &err), 0, "%s\n%s", err.msg, text);
    free(text);
    return g;
}

Test(json_schema, llamacpp_text_for_an_object) {
    char *g = convert("{\"type\": \"object\", \"properties\": {\"name\": {\"type\": \"string\"}, "
                      "\"age\": {\"type\": \"integer\"}}, \"required\": [\"name\"]}");
    // What llama.cpp's json_schema_to_grammar writes for this schema.
    const char *want =
        "age-kv ::= \"\\\"age\\\"\" space \":\" space integer\n"
        "char ::= [^\"\\\\\\x7F\\x00-\\x1F] | [\\\\] ([\"\\\\bfnrt] | \"u\" [0-9a-fA-F]{4})\n"
        "integer ::= (\"-\"? integral-part) space\n"
        "integral-part ::= [0] | [1-9] [0-9]{0,15}\n"
        "name-kv ::= \"\\\"name\\\"\" space \":\" space string\n"
        "root ::= \"{\" space name-kv ( \",\" space ( age-kv ) )? \"}\" space\n"
        "space ::= | \" \" | \"\\n\"{1,2} [ \\t]{0,20}\n"
        "string ::= \"\\\"\" char* \"\\\"\" space\n";
    cr_expect_str_eq(g, want);
    free(g);
    // An array of items with bounds (llama.cpp's README example without the
    // integer range).
    g = convert(
        "{\"type\": \"array\", \"items\": {\"type\": \"object\", \"properties\": {\"name\": "
        "{\"type\": \"string\", \"minLength\": 1, \"maxLength\": 100}}, \"required\": "
        "[\"name\"], \"additionalProperties\": false}, \"minItems\": 10, \"maxItems\": 100}");
    cr_expect(strstr(g, "item ::= \"{\" space item-name-kv \"}\" space\n"), "%s", g);
    cr_expect(strstr(g, "item-name ::= \"\\\"\" char{1,100} \"\\\"\" space\n"), "%s", g);
    cr_expect(strstr(g, "root ::= \"[\" space item (\",\" space item){9,99} \"]\" space\n"), "%s",
              g);
    free(g);
}

struct case_ {
    const char *text;
    bool ok;
};

static void check_cases(const char *schema, const struct case_ *cases, int n) {
    struct grammar *g = schema_grammar(schema);
    for (int i = 0; i < n; i++)
        cr_expect_eq(gh_matches(g, cases[i].text), cases[i].ok, "schema %s\ntext %s: %s", schema,
                     cases[i].text, cases[i].ok ? "refused" : "accepted");
    grammar_free(g);
}

Test(json_schema, person_with_optional_and_additional_properties) {
    const char *schema =
        "{\"type\": \"object\", \"properties\": {\"name\": {\"type\": \"string\"}, \"age\": "
        "{\"type\": \"integer\"}, \"tags\": {\"type\": \"array\", \"items\": {\"type\": "
        "\"string\"}, "
        "\"maxItems\": 2}}, \"required\": [\"name\", \"age\"]}";
    const struct case_ cases[] = {
        {"{\"name\": \"Bob\", \"age\": 42}", true},
        {"{\"name\":\"Bob\",\"age\":-1,\"tags\":[\"a\",\"b\"]}", true},
        {"{\n  \"name\": \"Bob\",\n  \"age\": 42\n}", true},
        {"{\"age\": 42, \"name\": \"Bob\"}", false}, // declared order
        {"{\"name\": \"Bob\"}", false},              // age is required
        {"{\"name\": \"Bob\", \"age\": 4.5}", false},
        {"{\"name\": \"Bob\", \"age\": 42, \"tags\": [\"a\", \"b\", \"c\"]}", false},
        {"{\"name\": \"Bob\", \"age\": 42, \"x\": 1}", false}, // no additional properties
    };
    check_cases(schema, cases, sizeof cases / sizeof cases[0]);
    const char *open = "{\"properties\": {\"a\": {\"type\": \"boolean\"}, \"ab\": {\"type\": "
                       "\"null\"}}, \"additionalProperties\": {\"type\": \"number\"}}";
    const struct case_ open_cases[] = {
        {"{}", true},
        {"{\"a\": true}", true},
        {"{\"ab\": null, \"x\": 1.5e3, \"abc\": 2}", true},
        {"{\"a\": true, \"ab\": null, \"b\": 1}", true},
        {"{\"a\": 1}", false},     // a is boolean, not an additional number
        {"{\"x\": \"s\"}", false}, // additional values are numbers
        {"{\"ab\": null, \"a\": true}", false},
    };
    check_cases(open, open_cases, sizeof open_cases / sizeof open_cases[0]);
}

Test(json_schema, types_enums_unions_refs_and_formats) {
    const struct case_ e[] = {{"\"red\"", true}, {"42", true}, {"null", true}, {"\"blue\"", false}};
    check_cases("{\"enum\": [\"red\", 42, null]}", e, 4);
    const struct case_ k[] = {{"{\"a\":[1,2]}", true}, {"{\"a\":[1]}", false}};
    check_cases("{\"const\": {\"a\": [1, 2]}}", k, 2);
    const struct case_ u[] = {{"\"x\"", true}, {"7", true}, {"7.5", false}, {"true", false}};
    check_cases("{\"anyOf\": [{\"type\": \"string\"}, {\"type\": \"integer\"}]}", u, 4);
    check_cases("{\"oneOf\": [{\"type\": \"string\"}, {\"type\": \"integer\"}]}", u, 4);
    check_cases("{\"type\": [\"string\", \"integer\"]}", u, 4);
    const struct case_ r[] = {{"{\"next\": {\"next\": null}}", true},
                              {"{\"next\": null}", true},
                              {"{\"next\": 1}", false}};
    check_cases("{\"$ref\": \"#/$defs/node\", \"$defs\": {\"node\": {\"type\": \"object\", "
                "\"properties\": {\"next\": {\"anyOf\": [{\"$ref\": \"#/$defs/node\"}, {\"type\": "
                "\"null\"}]}}, \"required\": [\"next\"]}}}",
                r, 3);
    const struct case_ d[] = {{"{\"p\": 1}", true}, {"{\"p\": \"1\"}", false}};
    check_cases("{\"type\": \"object\", \"properties\": {\"p\": {\"$ref\": "
                "\"#/definitions/n\"}}, \"required\": [\"p\"], \"definitions\": {\"n\": {\"type\": "
                "\"number\"}}}",
                d, 2);
    const struct case_ f[] = {
        {"\"2024-02-29\"", true}, {"\"2024-13-01\"", false}, {"\"12:30:00Z\"", false}};
    check_cases("{\"type\": \"string\", \"format\": \"date\"}", f, 3);
    const struct case_ t[] = {{"\"12:30:00Z\"", true}, {"\"25:00:00Z\"", false}};
    check_cases("{\"type\": \"string\", \"format\": \"time\"}", t, 2);
    const struct case_ id[] = {{"\"123e4567-e89b-12d3-a456-426614174000\"", true},
                               {"\"123e4567\"", false}};
    check_cases("{\"type\": \"string\", \"format\": \"uuid\"}", id, 2);
    const struct case_ s[] = {
        {"\"ab\"", true}, {"\"a\"", false}, {"\"abcd\"", false}, {"\"a\\\"b\"", true}};
    check_cases("{\"type\": \"string\", \"minLength\": 2, \"maxLength\": 3}", s, 4);
    const struct case_ tu[] = {{"[1, \"x\"]", true}, {"[1]", false}};
    check_cases(
        "{\"type\": \"array\", \"items\": [{\"type\": \"integer\"}, {\"type\": \"string\"}]}", tu,
        2);
}

Test(json_schema, any_json_object) {
    // {} and {"type": "object"}: response_format json_object.
    const struct case_ c[] = {{"{\"a\": [1, {\"b\": null}], \"c\": \"d\"}", true},
                              {"{}", true},
                              {"[1]", false},
                              {"\"s\"", false}};
    check_cases("{}", c, 4);
    check_cases("{\"type\": \"object\"}", c, 4);
    // A schema of annotations only: any value.
    const struct case_ v[] = {{"[1]", true}, {"\"s\"", true}};
    check_cases("{\"description\": \"anything\"}", v, 2);
}

static void expect_error(const char *schema, int code, const char *want) {
    char *g = NULL;
    struct verr err = {0};
    cr_expect_eq(json_schema_text_to_gbnf(schema, strlen(schema), &g, &err), code, "%s: %s", schema,
                 err.msg);
    cr_expect_null(g);
    cr_expect(strstr(err.msg, want), "%s\ngot:  %s\nwant: %s", schema, err.msg, want);
    free(g);
}

Test(json_schema, errors_name_the_json_pointer) {
    expect_error("{\"type\": \"object\", \"properties\": {\"age\": {\"type\": \"integer\", "
                 "\"multipleOf\": 2}}}",
                 VERR_UNSUPPORTED, "/properties/age: keyword 'multipleOf' is not supported");
    expect_error("{\"type\": \"array\", \"items\": {\"type\": \"string\", \"pattern\": \"^a$\"}}",
                 VERR_UNSUPPORTED, "/items: keyword 'pattern' is not supported");
    expect_error("{\"anyOf\": [{\"type\": \"string\"}, {\"not\": {}}]}", VERR_UNSUPPORTED,
                 "/anyOf/1: keyword 'not' is not supported");
    expect_error("{\"$ref\": \"https://example.com/s.json\"}", VERR_UNSUPPORTED,
                 "(root): $ref 'https://example.com/s.json' does not point into this schema");
    expect_error("{\"type\": \"object\", \"properties\": {\"a/b\": {\"type\": \"date\"}}}",
                 VERR_UNSUPPORTED, "/properties/a~1b: type 'date' is not supported");
    expect_error("{\"$defs\": {\"x\": {\"minimum\": 3}}, \"$ref\": \"#/$defs/x\"}",
                 VERR_UNSUPPORTED, "/$defs/x: keyword 'minimum' is not supported");
    expect_error("{\"type\": \"string\", \"maxLength\": -1}", VERR_FORMAT,
                 "(root): 'maxLength' must be an integer");
    expect_error("[1]", VERR_FORMAT, "(root): a schema must be an object or true");
    expect_error("{\"type\": ", VERR_FORMAT, "not JSON");
}

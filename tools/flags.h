// A table of command-line flags and the code that reads argv and the
// environment with it and writes --help from it (the model: llama.cpp's
// common/arg.cpp). The rows themselves, one per flag, are in tools/args_table.c.
//
// A row names every spelling of a flag, its value, its help, the
// environment variable that may give it (read before argv, which wins), the
// commands that take it (a bitmask) and how its value is read into a field
// of the options struct (an offset into it). Nothing here prints or exits:
// errors come back as VERR_RANGE with a message that names the flag or the
// variable, the value and what was expected.
#ifndef VELA_TOOLS_FLAGS_H
#define VELA_TOOLS_FLAGS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>

#include "gguf/verr.h"

enum flag_kind {
    FLAG_HELP,  // -h, --help: parsing stops, the caller prints the usage
    FLAG_SET,   // no value: the bool field becomes true
    FLAG_UNSET, // no value: the bool field becomes false
    FLAG_INT,   // an int in [lo, hi]
    FLAG_FLOAT, // a finite float in [lo, hi] (lo excluded with lo_open)
    FLAG_STR,   // a const char * (pointing into argv or the environment)
    FLAG_ENUM,  // one of choices' names; the int field gets its value
    FLAG_FN,    // fn reads the values
    FLAG_NOTE,  // no flag: help text printed among the rows (names NULL)
};

struct flag_choice {
    const char *name; // NULL ends the list
    int value;
};

// FLAG_FN rows with this n_values take the next argument when fn accepts it.
#define FLAG_VALUE_OPTIONAL (-1)

struct flag {
    unsigned cmds;     // the commands that take it (the caller's bits)
    int section;       // where --help lists it (an index into flag_table.sections)
    const char *names; // every spelling, ", " between them: "-m, --model"
    const char *value; // the value's placeholder in --help ("N", "FILE"); NULL: none
    const char *help;  // a paragraph; flags_help wraps it, '\n' breaks a line
    const char *env;   // a variable that gives the value when argv does not, or NULL
    enum flag_kind kind;
    size_t off;    // the field it sets: offsetof(options struct, field)
    size_t seen;   // offsetof + 1 of a bool set when the flag is given; 0: none
    double lo, hi; // FLAG_INT, FLAG_FLOAT: the range (inclusive; +-INFINITY: open)
    bool lo_open;  // FLAG_FLOAT: lo itself is refused
    const struct flag_choice *choices; // FLAG_ENUM
    const char *expected;              // FLAG_ENUM: "an activation type (q8, f32)"
    int n_values;                      // FLAG_FN: values it takes (0, 1, 2, optional)
    // FLAG_FN: reads vals[0..n) into opts; where: the spelling used (or the
    // variable). Returns how many values it took (>= 0) or a VERR_* code.
    int (*fn)(void *opts, const struct flag *f, const char *where, const char *const *vals, int n,
              struct verr *err);
};

struct flag_table {
    const struct flag *rows;
    size_t n_rows;
    const char *const *sections; // [n_sections] titles ("" none); --help's order
    int n_sections;
};

// Values for FLAG_FN readers, with the table's messages: "WHERE: 'S' is not
// an integer in [lo, hi]", "WHERE: 'S' is not a number", ...
int flags_read_int(const char *where, const char *s, long lo, long hi, int *out, struct verr *err);
int flags_read_float(const char *where, const char *s, float *out, struct verr *err);

enum flags_status {
    FLAGS_OK = 0,
    FLAGS_HELP = 1,    // -h / --help was given
    FLAGS_UNKNOWN = 2, // an unknown flag (err names it)
};

// Fills opts for command cmd from the environment, then from argv[first..argc):
// flags in any order (a later one wins), "--name=value" for a flag's single
// value, "--" ends the flags. Up to max_pos other arguments go to pos[]
// (*n_pos of them); more, or any with max_pos 0, are errors.
// FLAGS_OK, FLAGS_HELP, FLAGS_UNKNOWN (err set) or a VERR_* code (err set).
int flags_parse(const struct flag_table *t, unsigned cmd, void *opts, int argc, char **argv,
                int first, const char **pos, int max_pos, int *n_pos, struct verr *err);

// One flag at argv[*i] when it is cmd's: 1 (taken, *i past its values), 2
// (-h / --help, *i unchanged), 0 (not cmd's flag, *i unchanged) or a VERR_*
// code.
int flags_parse_one(const struct flag_table *t, unsigned cmd, void *opts, int argc, char **argv,
                    int *i, struct verr *err);

// The environment's values of cmd's flags; 0 or a VERR_* code.
int flags_parse_env(const struct flag_table *t, unsigned cmd, void *opts, struct verr *err);

// cmd's flags, section by section: "  -m, --model FILE" in a column of 28,
// the help beside it wrapped at 80 columns, the variable after it.
void flags_help(FILE *out, const struct flag_table *t, unsigned cmd);

#endif

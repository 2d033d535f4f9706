// vela CUDA emulator (tests/emu): extensions a program built against the
// emulator may call (not CUDA; never included by cuda/). Plain C.
#ifndef VELA_EMU_H
#define VELA_EMU_H

#ifdef __cplusplus
extern "C" {
#endif

// Labels the launches that follow in the VELA_EMU_TRAFFIC records: json is
// a JSON object (copied; written verbatim as the record's "case" member),
// NULL or "" ends the label. Lets a driver (bench/kernels/bench_kernels.c
// built as vela-bench-kernels-emu) say which op call, model and shape a
// launch belongs to.
void emu_traffic_case(const char *json);

#ifdef __cplusplus
}
#endif

#endif

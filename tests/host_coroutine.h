// One GPU thread of a host emulation as a coroutine (ucontext) on its own stack: shared by
// tests/es_spmm_host_harness.cpp and tests/shadow_block_host_harness.cpp.
#pragma once

#include <ucontext.h>

#include <vector>

// (Re)start `ctx` to run `entry` on `stack`; when `entry` returns, control switches to `link` (the scheduler).
inline void start_coroutine(ucontext_t& ctx, std::vector<char>& stack, ucontext_t* link, void (*entry)()) {
    getcontext(&ctx);
    ctx.uc_stack.ss_sp = stack.data();
    ctx.uc_stack.ss_size = stack.size();
    ctx.uc_link = link;
    makecontext(&ctx, entry, 0);
}

// A launch of a slax kernel on SlangPy's CPU device over the machine's cores. slax/_gxx_wrapper.py
// appends this to the C++ Slang writes for a kernel and renames the kernel's exported dispatch
// function (which runs a box of thread groups one after another) to slax_serial_<name>; the
// exported <name> then runs slax_dispatch, which splits the launch's groups, in the order the
// serial function runs them, into contiguous ranges, one a worker thread.
//
// Splitting changes no result: the CPU target has no group barriers and no memory shared between
// groups (a group's "group-shared" memory is one thread's), so groups depend on one another only
// through memory two of them write. Kernels that add into one buffer from many groups
// (slax_accumulate, shaders/slax/tensor.slang) add in the order of the groups: each worker gets a
// SlaxAddOrder (the first adds in place, the others log their adds until the turn passed from
// worker to worker in order reaches them), and the sums are the bits of a serial launch. A kernel
// with Slang's atomics (the wrapper leaves it as Slang wrote it) runs its groups in order on one
// thread. A fault record (slax.config.debug_bounds) keeps one of the launch's faults, claimed
// whole (slax_record_fault), as on a GPU.
//
// Each worker marks itself as running a kernel for slax/_cpu_signals.c (slax_kernel_enter and
// slax_kernel_leave, which that library exports once loaded with RTLD_GLOBAL): an integer division
// by zero on it then gives lavapipe's values, as on the launching thread. Where those functions are
// not found, the launch runs serially. SLAX_CPU_THREADS sets the most workers a launch takes
// (default: the cores this process may run on); a launch takes one worker per
// SLAX_GROUPS_PER_WORKER groups at most, since a small one runs faster than threads start.
// SLAX_CPU_ADD_LOG_BYTES sets the most memory a worker's log of adds takes (default 64 MiB).
//
// The code is C over POSIX threads, built with the command line's target options (the kernel's
// prelude may have set `#pragma GCC target("f16c")`, under which GCC 13 refuses to inline the C++
// library's always_inline functions into code parsed before it).
#pragma GCC push_options
#pragma GCC reset_options
#include <dlfcn.h>
#include <pthread.h>
#include <sched.h>
#include <stdint.h>
#include <stdlib.h>

#ifndef SLAX_GROUPS_PER_WORKER
#define SLAX_GROUPS_PER_WORKER 16
#endif
#define SLAX_MOST_WORKERS 256

typedef void (*SlaxGroupBox)(ComputeVaryingInput*, void*, void*);
typedef void (*SlaxSignalHook)(void);

// Groups [first, end) of a launch whose groups run z, then y, then x fastest (as the serial
// function runs them), flattened over its y and x ranges: run as at most three boxes per z.
struct SlaxGroupRange
{
    SlaxGroupBox run;
    const ComputeVaryingInput* launch;
    void* entryPointParams;
    void* globalParams;
    uint64_t first, end;
    SlaxSignalHook enter, leave;
#ifdef SLAX_ADDS_IN_ORDER
    SlaxAddOrder order;  // this range's place in the order of adds
#endif
};

static void slax_run_box(const SlaxGroupRange* range, uint32_t z, uint32_t y0, uint32_t y1, uint32_t x0, uint32_t x1)
{
    if (y0 >= y1 || x0 >= x1)
        return;
    ComputeVaryingInput box = *range->launch;
    box.startGroupID.z = z;
    box.endGroupID.z = z + 1;
    box.startGroupID.y = y0;
    box.endGroupID.y = y1;
    box.startGroupID.x = x0;
    box.endGroupID.x = x1;
    range->run(&box, range->entryPointParams, range->globalParams);
}

static void slax_run_groups(const SlaxGroupRange* range)
{
    const ComputeVaryingInput* launch = range->launch;
    uint64_t width = launch->endGroupID.x - launch->startGroupID.x;
    uint64_t plane = width * (launch->endGroupID.y - launch->startGroupID.y);
    for (uint64_t at = range->first; at < range->end;)
    {
        // The rest of this z's plane, or of the range: a row's tail, whole rows, a row's head.
        uint64_t z = at / plane, stop = (z + 1) * plane < range->end ? (z + 1) * plane : range->end;
        uint64_t a = at - z * plane, b = stop - z * plane;
        uint32_t zz = launch->startGroupID.z + uint32_t(z), y = launch->startGroupID.y, x = launch->startGroupID.x;
        uint64_t rowA = a / width, rowB = b / width;
        if (rowA == rowB)
            slax_run_box(range, zz, y + rowA, y + rowA + 1, x + a % width, x + b % width);
        else
        {
            slax_run_box(range, zz, y + rowA, y + rowA + 1, x + a % width, x + width);
            slax_run_box(range, zz, y + rowA + 1, y + rowB, x, x + width);
            slax_run_box(range, zz, y + rowB, y + rowB + 1, x, x + b % width);
        }
        at = stop;
    }
}

// The range's groups, their adds in order: in place once every range before it has added all it
// had, and then the turn passed on.
static void slax_run_range(SlaxGroupRange* range)
{
#ifdef SLAX_ADDS_IN_ORDER
    slax_add_order = &range->order;
    slax_run_groups(range);
    if (!range->order.inPlace)
        slax_take_turn(&range->order);
    slax_add_order = nullptr;
    __atomic_store_n(range->order.turn, range->order.worker + 1, __ATOMIC_RELEASE);
#else
    slax_run_groups(range);
#endif
}

static void* slax_worker(void* argument)
{
    SlaxGroupRange* range = (SlaxGroupRange*)argument;
    range->enter();
    slax_run_range(range);
    range->leave();
    return nullptr;
}

static unsigned slax_dispatch_workers(uint64_t groups)
{
    unsigned workers = 0;
    if (const char* setting = getenv("SLAX_CPU_THREADS"))
        workers = unsigned(strtoul(setting, nullptr, 10));
    if (workers == 0)
    {
        cpu_set_t allowed;
        workers = sched_getaffinity(0, sizeof(allowed), &allowed) == 0 ? unsigned(CPU_COUNT(&allowed)) : 1;
    }
    uint64_t most = groups / SLAX_GROUPS_PER_WORKER;
    if (most < workers)
        workers = unsigned(most > 0 ? most : 1);
    return workers < SLAX_MOST_WORKERS ? workers : SLAX_MOST_WORKERS;
}

#ifdef SLAX_ADDS_IN_ORDER
// The most bytes a worker's log of adds may take (SLAX_CPU_ADD_LOG_BYTES; default 64 MiB).
static size_t slax_add_log_limit(void)
{
    const char* setting = getenv("SLAX_CPU_ADD_LOG_BYTES");
    return setting != nullptr && *setting != 0 ? size_t(strtoull(setting, nullptr, 10)) : size_t(64) << 20;
}
#endif

static void slax_dispatch(SlaxGroupBox run, ComputeVaryingInput* launch, void* entryPointParams, void* globalParams)
{
    uint64_t groups = 1;
    for (int axis = 0; axis < 3; axis++)
    {
        uint32_t start = (&launch->startGroupID.x)[axis], end = (&launch->endGroupID.x)[axis];
        groups *= end > start ? end - start : 0;
    }
    unsigned workers = groups > 0 ? slax_dispatch_workers(groups) : 1;
    SlaxSignalHook enter = workers > 1 ? (SlaxSignalHook)dlsym(RTLD_DEFAULT, "slax_kernel_enter") : nullptr;
    SlaxSignalHook leave = workers > 1 ? (SlaxSignalHook)dlsym(RTLD_DEFAULT, "slax_kernel_leave") : nullptr;
    if (workers <= 1 || enter == nullptr || leave == nullptr)
    {
        run(launch, entryPointParams, globalParams);
        return;
    }
    SlaxGroupRange ranges[SLAX_MOST_WORKERS];
    pthread_t threads[SLAX_MOST_WORKERS];
    bool started[SLAX_MOST_WORKERS];
#ifdef SLAX_ADDS_IN_ORDER
    int turn = 0;
    size_t logLimit = slax_add_log_limit();
    __atomic_add_fetch(&slax_spread_launches, 1, __ATOMIC_RELAXED);  // before any worker starts
#endif
    for (unsigned w = 0; w < workers; w++)
    {
        SlaxGroupRange* range = &ranges[w];
        *range = {run, launch, entryPointParams, globalParams, groups * w / workers, groups * (w + 1) / workers,
                  enter, leave};
#ifdef SLAX_ADDS_IN_ORDER
        range->order = {&turn, int(w), w == 0, logLimit, nullptr, 0, 0};
#endif
    }
    for (unsigned w = 1; w < workers; w++)
        started[w] = pthread_create(&threads[w], nullptr, slax_worker, &ranges[w]) == 0;
    slax_run_range(&ranges[0]);
    for (unsigned w = 1; w < workers; w++)  // a range no thread could be had for, after those before it
        if (!started[w])
            slax_run_range(&ranges[w]);
    for (unsigned w = 1; w < workers; w++)
        if (started[w])
            pthread_join(threads[w], nullptr);
#ifdef SLAX_ADDS_IN_ORDER
    __atomic_sub_fetch(&slax_spread_launches, 1, __ATOMIC_RELAXED);
#endif
}
#pragma GCC pop_options

// A launch of a slax kernel on SlangPy's CPU device over the machine's cores. slax/_gxx_wrapper.py
// appends this to the C++ Slang writes for a kernel and renames the kernel's exported dispatch
// function (which runs the launch's thread groups one after another) to slax_serial_<name>; the
// exported <name> then runs slax_dispatch, which splits the groups into contiguous ranges, one a
// worker thread, and runs each range with that function.
//
// Splitting changes no result: the CPU target has no group barriers, atomics or shared memory
// across groups (a group's "group-shared" memory is one thread's), so groups depend on one another
// only through memory two of them write. Kernels that add into one buffer from many groups
// (slax_accumulate, shaders/slax/tensor.slang: the sums are kept the same bits on every run) define
// SLAX_SERIAL_DISPATCH and run in order; so does a kernel with Slang's atomics (the wrapper leaves
// it as Slang wrote it). A fault record (debug_bounds) keeps one fault of those a launch makes, as
// on a GPU, where which one is not defined.
//
// Each worker marks itself as running a kernel for slax/_cpu_signals.c (slax_kernel_enter and
// slax_kernel_leave, which that library exports once loaded with RTLD_GLOBAL): an integer division
// by zero on it then gives lavapipe's values, as on the launching thread. Where those functions are
// not found, the launch runs serially. SLAX_CPU_THREADS sets the most workers a launch takes
// (default: the cores this process may run on); a launch gets one worker per SLAX_GROUPS_PER_WORKER
// groups at most, since a small one runs faster than threads start.
#include <dlfcn.h>
#include <sched.h>

#include <cstdlib>
#include <thread>
#include <vector>

#ifndef SLAX_GROUPS_PER_WORKER
#define SLAX_GROUPS_PER_WORKER 16
#endif

typedef void (*SlaxGroupRange)(ComputeVaryingInput*, void*, void*);

static unsigned slax_dispatch_workers(uint64_t groups)
{
    unsigned workers = 0;
    if (const char* setting = std::getenv("SLAX_CPU_THREADS"))
        workers = unsigned(std::strtoul(setting, nullptr, 10));
    if (workers == 0)
    {
        cpu_set_t allowed;
        workers = sched_getaffinity(0, sizeof(allowed), &allowed) == 0 ? unsigned(CPU_COUNT(&allowed))
                                                                       : std::thread::hardware_concurrency();
    }
    uint64_t most = groups / SLAX_GROUPS_PER_WORKER;
    return unsigned(most < workers ? (most > 0 ? most : 1) : workers);
}

static void slax_dispatch(SlaxGroupRange run, ComputeVaryingInput* input, void* entryPointParams, void* globalParams)
{
#ifdef SLAX_SERIAL_DISPATCH
    run(input, entryPointParams, globalParams);
#else
    // The axis to split: the outermost with more than one group (the grid of slax's launches runs
    // along x, then y past 2^21 threads).
    int axis = input->endGroupID.z - input->startGroupID.z > 1 ? 2
               : input->endGroupID.y - input->startGroupID.y > 1 ? 1 : 0;
    uint32_t start = (&input->startGroupID.x)[axis], end = (&input->endGroupID.x)[axis];
    uint64_t groups = uint64_t(input->endGroupID.x - input->startGroupID.x) *
                      (input->endGroupID.y - input->startGroupID.y) * (input->endGroupID.z - input->startGroupID.z);
    unsigned workers = end > start ? slax_dispatch_workers(groups) : 1;
    if (workers > end - start)
        workers = end - start;
    typedef void (*SlaxSignalHook)(void);
    SlaxSignalHook enter = workers > 1 ? (SlaxSignalHook)dlsym(RTLD_DEFAULT, "slax_kernel_enter") : nullptr;
    SlaxSignalHook leave = workers > 1 ? (SlaxSignalHook)dlsym(RTLD_DEFAULT, "slax_kernel_leave") : nullptr;
    if (workers <= 1 || enter == nullptr || leave == nullptr)
    {
        run(input, entryPointParams, globalParams);
        return;
    }
    std::vector<ComputeVaryingInput> ranges(workers, *input);
    for (unsigned w = 0; w < workers; w++)
    {
        (&ranges[w].startGroupID.x)[axis] = start + uint32_t(uint64_t(end - start) * w / workers);
        (&ranges[w].endGroupID.x)[axis] = start + uint32_t(uint64_t(end - start) * (w + 1) / workers);
    }
    std::vector<std::thread> threads;
    threads.reserve(workers - 1);
    for (unsigned w = 1; w < workers; w++)
    {
        ComputeVaryingInput* range = &ranges[w];
        try
        {
            threads.emplace_back([=] {
                enter();
                run(range, entryPointParams, globalParams);
                leave();
            });
        }
        catch (...)  // no thread to be had: this one runs the range
        {
            run(range, entryPointParams, globalParams);
        }
    }
    run(&ranges[0], entryPointParams, globalParams);
    for (std::thread& thread : threads)
        thread.join();
#endif
}

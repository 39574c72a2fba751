// Signals while a slax kernel runs on SlangPy's CPU device (and Ctrl-C while one runs on Vulkan).
// slax/_cpu_signals.py builds and loads it.
//
// SIGFPE: integer division by zero in Slang kernels, given the values Vulkan (Mesa's lavapipe)
// gives instead of killing the process. Slang's CPU target writes an integer `/` or `%` as C++'s,
// which x86-64 computes with div/idiv: a zero divisor (or INT_MIN / -1) raises #DE, which Linux
// delivers as SIGFPE, and the process dies. Nothing in the generated C++ can change a built-in
// operator, so this SIGFPE handler finishes the faulting instruction itself: it decodes the
// div/idiv at the faulting address, writes the quotient and remainder lavapipe gives into the
// registers the instruction writes, and resumes after it. Only while this thread runs a slax
// kernel (slax_kernel_enter/leave); any other SIGFPE goes to the handler installed before this
// one, as if this one were not there.
//
// The values, for a zero divisor: signed x / 0 = 0, x % 0 = -1; unsigned x / 0 and x % 0 = all
// ones; and INT_MIN / -1 = INT_MIN, INT_MIN % -1 = 0 (no overflow trap), at every width.
//
// SIGINT (Ctrl-C): a kernel runs inside SlangPy's dispatch, in C++ (or, on Vulkan, in the driver
// while the launching thread waits for it in C++), and Python runs its SIGINT handler
// (KeyboardInterrupt) only once the dispatch returns; nothing can stop the kernel midway
// without unwinding SlangPy's and Python's frames from a signal handler, which would leave both
// inconsistent. So while any thread runs a kernel, the first SIGINT goes to the handler installed
// before this one (Python's: KeyboardInterrupt follows when the kernel returns) and says so on
// stderr; a second one before the kernels return ends the process as SIGINT's default action
// does, so that a kernel caught in an endless loop never holds the process past two Ctrl-Cs.
#define _GNU_SOURCE
#include <signal.h>
#include <stdint.h>
#include <string.h>
#include <ucontext.h>

#include <unistd.h>

static __thread int in_kernel;
static int kernels_running, interrupts;
static struct sigaction previous_division, previous_interrupt;
static int installed;

// A kernel runs elsewhere (a Vulkan driver's threads) while this thread waits for it: SIGINT is a
// kernel's, but a division fault on this thread is not.
void slax_wait_enter(void) { __atomic_add_fetch(&kernels_running, 1, __ATOMIC_SEQ_CST); }

void slax_wait_leave(void)
{
    if (__atomic_sub_fetch(&kernels_running, 1, __ATOMIC_SEQ_CST) == 0)
        __atomic_store_n(&interrupts, 0, __ATOMIC_SEQ_CST);
}

// This thread runs a kernel (SlangPy's CPU device): SIGINT and its division faults are a kernel's.
void slax_kernel_enter(void)
{
    in_kernel++;
    slax_wait_enter();
}

void slax_kernel_leave(void)
{
    in_kernel--;
    slax_wait_leave();
}

// The general register numbered `n` in x86-64 encodings (rax, rcx, rdx, rbx, rsp, rbp, rsi, rdi,
// r8-r15), in glibc's saved context.
static greg_t *general_register(mcontext_t *context, int n)
{
    static const int order[16] = {REG_RAX, REG_RCX, REG_RDX, REG_RBX, REG_RSP, REG_RBP, REG_RSI, REG_RDI,
                                  REG_R8,  REG_R9,  REG_R10, REG_R11, REG_R12, REG_R13, REG_R14, REG_R15};
    return &context->gregs[order[n]];
}

// Decodes a div or idiv at `code`; on success sets its divisor, operand width in bits, signedness
// and length in bytes and returns 1.
static int decode_division(mcontext_t *context, const uint8_t *code, uint64_t *divisor, int *bits,
                           int *is_signed, int *length)
{
    const uint8_t *p = code;
    int operand16 = 0, rex = 0;
    for (;; p++) {
        if (*p == 0x66)
            operand16 = 1;
        else if (!(*p == 0x67 || *p == 0xF0 || *p == 0xF2 || *p == 0xF3 || *p == 0x2E || *p == 0x36 ||
                   *p == 0x3E || *p == 0x26 || *p == 0x64 || *p == 0x65))
            break;
    }
    if ((*p & 0xF0) == 0x40)
        rex = *p++;
    if (*p != 0xF6 && *p != 0xF7)
        return 0;
    *bits = *p++ == 0xF6 ? 8 : (rex & 8) ? 64 : operand16 ? 16 : 32;
    uint8_t modrm = *p++;
    int mod = modrm >> 6, reg = (modrm >> 3) & 7, rm = modrm & 7;
    if (reg != 6 && reg != 7)
        return 0;
    *is_signed = reg == 7;
    uint64_t value;
    if (mod == 3) {
        int n = rm | ((rex & 1) << 3);
        if (*bits == 8 && !rex && rm >= 4)  // ah, ch, dh, bh
            value = (uint64_t)*general_register(context, rm - 4) >> 8;
        else
            value = (uint64_t)*general_register(context, n);
    } else {
        uint64_t address = 0;
        int rip_relative = 0;
        if (rm == 4) {
            uint8_t sib = *p++;
            int index = ((sib >> 3) & 7) | ((rex & 2) << 2), base = sib & 7;
            if (index != 4)
                address += (uint64_t)*general_register(context, index) << (sib >> 6);
            if (base == 5 && mod == 0) {
                address += (uint64_t)(int64_t)*(const int32_t *)p;
                p += 4;
            } else {
                address += (uint64_t)*general_register(context, base | ((rex & 1) << 3));
            }
        } else if (rm == 5 && mod == 0) {
            rip_relative = 1;
        } else {
            address += (uint64_t)*general_register(context, rm | ((rex & 1) << 3));
        }
        if (mod == 1)
            address += (uint64_t)(int64_t)*(const int8_t *)p++;
        else if (mod == 2 || rip_relative) {
            address += (uint64_t)(int64_t)*(const int32_t *)p;
            p += 4;
        }
        if (rip_relative)
            address += (uint64_t)(p - code) + (uint64_t)context->gregs[REG_RIP];
        memcpy(&value, (const void *)address, (size_t)(*bits / 8));
    }
    *divisor = *bits == 64 ? value : value & ((1ull << *bits) - 1);
    *length = (int)(p - code);
    return 1;
}

// Whether `info` is a hardware fault (a faulting instruction), not a signal sent to the process.
static int is_fault(int signal, const siginfo_t *info) { return signal == SIGFPE && info->si_code > 0; }

// Ends the process as `signal`'s default action does: returning re-runs a faulting instruction,
// which faults again; a sent signal is sent again.
static void default_action(int signal, const siginfo_t *info)
{
    struct sigaction fallback;
    memset(&fallback, 0, sizeof fallback);
    fallback.sa_handler = SIG_DFL;
    sigaction(signal, &fallback, 0);
    if (!is_fault(signal, info))
        raise(signal);
}

// Hands the signal to the handler installed before this library's; a fault cannot be ignored.
static void chain(const struct sigaction *previous, int signal, siginfo_t *info, void *context)
{
    if (previous->sa_flags & SA_SIGINFO)
        previous->sa_sigaction(signal, info, context);
    else if (previous->sa_handler == SIG_DFL || (previous->sa_handler == SIG_IGN && is_fault(signal, info)))
        default_action(signal, info);
    else if (previous->sa_handler != SIG_IGN)
        previous->sa_handler(signal);
}

static void say(const char *message) { (void)!write(STDERR_FILENO, message, strlen(message)); }

static void on_interrupt(int signal, siginfo_t *info, void *context)
{
    if (__atomic_load_n(&kernels_running, __ATOMIC_SEQ_CST) > 0) {
        if (__atomic_fetch_add(&interrupts, 1, __ATOMIC_SEQ_CST) > 0) {
            say("\nslax: interrupted again while a Slang kernel runs: ending the process.\n");
            default_action(signal, info);
            return;
        }
        say("\nslax: a Slang kernel is running, and SlangPy cannot stop it midway: KeyboardInterrupt "
            "is raised when it returns. Press Ctrl-C again to end the process.\n");
    }
    chain(&previous_interrupt, signal, info, context);
}

static void on_division_fault(int signal, siginfo_t *info, void *opaque)
{
    ucontext_t *context = opaque;
    mcontext_t *registers = &context->uc_mcontext;
    uint64_t divisor;
    int bits, is_signed, length;
    if (!in_kernel || info->si_code != FPE_INTDIV ||
        !decode_division(registers, (const uint8_t *)registers->gregs[REG_RIP], &divisor, &bits, &is_signed,
                         &length)) {
        chain(&previous_division, signal, info, opaque);
        return;
    }
    uint64_t mask = bits == 64 ? ~0ull : (1ull << bits) - 1;
    uint64_t quotient, remainder;
    if (divisor == 0) {
        quotient = is_signed ? 0 : mask;
        remainder = mask;
    } else if (is_signed && divisor == mask) {  // the minimum divided by -1
        quotient = (uint64_t)registers->gregs[REG_RAX] & mask;
        remainder = 0;
    } else {
        chain(&previous_division, signal, info, opaque);
        return;
    }
    greg_t *rax = &registers->gregs[REG_RAX], *rdx = &registers->gregs[REG_RDX];
    if (bits == 8) {
        *rax = (*rax & ~(greg_t)0xFFFF) | (greg_t)(quotient | (remainder << 8));
    } else if (bits == 16) {
        *rax = (*rax & ~(greg_t)0xFFFF) | (greg_t)quotient;
        *rdx = (*rdx & ~(greg_t)0xFFFF) | (greg_t)remainder;
    } else {  // a 32-bit register write clears the upper half
        *rax = (greg_t)quotient;
        *rdx = (greg_t)remainder;
    }
    registers->gregs[REG_RIP] += length;
}

static int install(int signal, void (*handler)(int, siginfo_t *, void *), struct sigaction *previous)
{
    struct sigaction action;
    memset(&action, 0, sizeof action);
    action.sa_sigaction = handler;
    action.sa_flags = SA_SIGINFO;
    sigemptyset(&action.sa_mask);
    return sigaction(signal, &action, previous);
}

// Installs the division handler once per process; returns 0, or -1 where sigaction failed.
int slax_install_division_handler(void)
{
    if (installed & 1)
        return 0;
    if (install(SIGFPE, on_division_fault, &previous_division) != 0)
        return -1;
    installed |= 1;
    return 0;
}

// Installs the interrupt handler in front of the current SIGINT handler (once per process;
// Python's signal.signal replaces it, as it would any); returns 0, or -1 where sigaction failed.
int slax_install_interrupt_handler(void)
{
    if (installed & 2)
        return 0;
    if (install(SIGINT, on_interrupt, &previous_interrupt) != 0)
        return -1;
    installed |= 2;
    return 0;
}

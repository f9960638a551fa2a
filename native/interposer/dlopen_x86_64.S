/*
 * dlopen_x86_64.S - the exported dlopen of libfgpu.so (x86_64 System V).
 *
 * Asks fgpu_dlopen_route (resolve.c) which file to open, then *jumps* to the real dlopen
 * with the caller's return address still on the stack: glibc finds the calling object from
 * that address to apply its RUNPATH/RPATH/$ORIGIN to relative names, so every dlopen that
 * is not the driver's behaves exactly as without libfgpu.so. See resolve.c for the why.
 */
#if defined(__x86_64__)
    .text
    .globl dlopen
    .type dlopen, @function
    .p2align 4
dlopen:
    .cfi_startproc
    pushq %rdi                 /* file */
    .cfi_adjust_cfa_offset 8
    pushq %rsi                 /* mode */
    .cfi_adjust_cfa_offset 8
    subq $8, %rsp              /* 16-byte alignment at the call */
    .cfi_adjust_cfa_offset 8
    call fgpu_dlopen_route     /* rax = file to open; also resolves fgpu_real_dlopen */
    addq $8, %rsp
    .cfi_adjust_cfa_offset -8
    popq %rsi
    .cfi_adjust_cfa_offset -8
    popq %rdi
    .cfi_adjust_cfa_offset -8
    movq %rax, %rdi
    jmp *fgpu_real_dlopen(%rip)
    .cfi_endproc
    .size dlopen, .-dlopen
#endif
    .section .note.GNU-stack, "", @progbits

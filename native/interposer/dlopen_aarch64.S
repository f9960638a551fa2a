/*
 * dlopen_aarch64.S - the exported dlopen of libfgpu.so (AArch64 AAPCS64).
 *
 * Same as dlopen_x86_64.S: ask fgpu_dlopen_route, restore the link register, branch (no
 * call) to the real dlopen so glibc sees the original caller. Assembled with binutils for
 * aarch64 and its disassembly read; never run (this project's CI is x86_64).
 */
#if defined(__aarch64__)
    .text
    .globl dlopen
    .type dlopen, %function
    .p2align 4
dlopen:
    .cfi_startproc
    stp x29, x30, [sp, #-32]!
    .cfi_def_cfa_offset 32
    .cfi_offset 29, -32
    .cfi_offset 30, -24
    mov x29, sp
    stp x0, x1, [sp, #16]        /* file, mode */
    bl fgpu_dlopen_route         /* x0 = file to open */
    ldr x1, [sp, #24]            /* mode */
    ldp x29, x30, [sp], #32      /* original frame pointer and return address */
    .cfi_def_cfa_offset 0
    .cfi_restore 29
    .cfi_restore 30
    adrp x16, fgpu_real_dlopen
    ldr x16, [x16, #:lo12:fgpu_real_dlopen]
    br x16
    .cfi_endproc
    .size dlopen, .-dlopen
#endif
    .section .note.GNU-stack, "", %progbits

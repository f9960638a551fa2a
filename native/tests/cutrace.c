/*
 * cutrace.c - the request recorder of the TRACING stand-in of libcuda.so.1 (a test target:
 * build.py links it with the fake driver's sources and -DFK_TRACE into trace/libcuda.so.1).
 *
 * It answers exactly as the fake driver does; in addition every cuGetProcAddress /
 * cuGetProcAddress_v2 request and every cuGetExportTable request is appended, one line each,
 * to the file named by FGPU_TRACE_OUT (nothing is recorded when it is unset):
 *     procaddr <TAB> symbol <TAB> cudaVersion <TAB> flags <TAB> CUresult <TAB> answered symbol
 *     exporttable <TAB> uuid (32 hex digits) <TAB> CUresult
 * Each line is one write(2) on an O_APPEND descriptor, so threads and processes never
 * interleave within a line. The tests run NVIDIA's CUDA runtime against it and keep the list
 * (tests/data/cudart_requests.json).
 */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "fake.h"

static void emit(const char *line, int n)
{
    const char *path = getenv("FGPU_TRACE_OUT");
    if (path == NULL || path[0] == '\0' || n <= 0)
        return;
    int fd = open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (fd < 0)
        return;
    ssize_t w = write(fd, line, (size_t)n);
    (void)w; /* a lost trace line shows up as a fixture difference, not a crash */
    close(fd);
}

void fk_trace_procaddr(const char *symbol, int cudaVersion, cuuint64_t flags, CUresult r,
                       const char *answer)
{
    char line[512];
    int n = snprintf(line, sizeof line, "procaddr\t%.200s\t%d\t%llu\t%d\t%.200s\n",
                     symbol != NULL ? symbol : "(null)", cudaVersion, (unsigned long long)flags,
                     r, answer != NULL ? answer : "");
    emit(line, n < (int)sizeof line ? n : (int)sizeof line - 1);
}

void fk_trace_export_table(const CUuuid *id, CUresult r)
{
    char hex[33] = "(null)";
    if (id != NULL) {
        for (int i = 0; i < 16; i++)
            snprintf(hex + 2 * i, 3, "%02x", (unsigned char)id->bytes[i]);
    }
    char line[128];
    int n = snprintf(line, sizeof line, "exporttable\t%s\t%d\n", hex, r);
    emit(line, n);
}

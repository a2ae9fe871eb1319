/* Reset handling for QEMU's mps2-an505 (Cortex-M33): enables the FPU, copies .data, clears
 * .bss, opens semihosting I/O, runs static constructors, calls main and reports its return
 * code to QEMU through semihosting exit. A fault exits QEMU with an error instead of hanging. */
#include <stdint.h>

extern uint32_t __stack_top, __data_load__, __data_start__, __data_end__, __bss_start__, __bss_end__;
extern int main(void);
extern void __libc_init_array(void);
extern void initialise_monitor_handles(void);
extern void exit(int);

void Reset_Handler(void) __attribute__((noreturn));

static void Fault_Handler(void) {
  register uint32_t r0 __asm("r0") = 0x18;    /* SYS_EXIT */
  register uint32_t r1 __asm("r1") = 0x20024; /* ADP_Stopped_RunTimeErrorUnknown */
  __asm volatile("bkpt 0xab" : : "r"(r0), "r"(r1));
  for (;;) {}
}

__attribute__((section(".vectors"), used)) const void* vectors[32] = {
    &__stack_top, (void*)Reset_Handler, [2 ... 31] = (void*)Fault_Handler,
};

void Reset_Handler(void) {
  *(volatile uint32_t*)0xE000ED88 |= (0xFu << 20); /* CPACR: CP10/CP11 full access */
  __asm volatile("dsb; isb");
  uint32_t *src = &__data_load__, *dst = &__data_start__;
  while (dst < &__data_end__) *dst++ = *src++;
  for (dst = &__bss_start__; dst < &__bss_end__;) *dst++ = 0;
  initialise_monitor_handles();
  __libc_init_array();
  exit(main());
  for (;;) {}
}

void _init(void) {}
void _fini(void) {}
void* __dso_handle = 0;

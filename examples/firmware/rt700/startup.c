/* Minimal reset path for the RT700 Cortex-M33 link (no clocks, caches or flash configuration
 * block: use the MCUXpresso SDK's startup_MIMXRT798S_cm33_core0.S and system file on a board).
 * Enables the FPU, copies .data, clears .bss, runs static constructors, calls main. */
#include <stdint.h>

extern uint32_t __stack_top, __data_load__, __data_start__, __data_end__, __bss_start__, __bss_end__;
extern int main(void);
extern void __libc_init_array(void);

void Reset_Handler(void) __attribute__((noreturn));
static void Default_Handler(void) {
  for (;;) {}
}

__attribute__((section(".vectors"), used)) const void* vectors[16] = {
    &__stack_top, (void*)Reset_Handler, [2 ... 15] = (void*)Default_Handler,
};

void Reset_Handler(void) {
  *(volatile uint32_t*)0xE000ED88 |= (0xFu << 20); /* CPACR: CP10/CP11 full access */
  __asm volatile("dsb; isb");
  uint32_t *src = &__data_load__, *dst = &__data_start__;
  while (dst < &__data_end__) *dst++ = *src++;
  for (dst = &__bss_start__; dst < &__bss_end__;) *dst++ = 0;
  __libc_init_array();
  main();
  for (;;) {}
}

void _init(void) {}
void _fini(void) {}
void* __dso_handle = 0;

/* Reset and exception handling for the QEMU mps2-an505 image: enables the FPU, copies .data,
 * clears .bss, opens semihosting I/O, runs static constructors (kernel and prim-op
 * registration), calls main and reports its return code to QEMU through semihosting exit.
 * SysTick counts every 2^24 ticks in etforge_systick_wraps (the emulated instruction count). */
#include <stdint.h>

extern uint32_t __stack_top, __data_load__, __data_start__, __data_end__, __bss_start__, __bss_end__;
extern int main(void);
extern void __libc_init_array(void);
extern void initialise_monitor_handles(void);
extern void exit(int);

volatile uint32_t etforge_systick_wraps;

void Reset_Handler(void) __attribute__((noreturn));

static void Fault_Handler(void) {
  /* SYS_EXIT with ADP_Stopped_RunTimeErrorUnknown: QEMU exits non-zero instead of hanging */
  register uint32_t r0 __asm("r0") = 0x18;
  register uint32_t r1 __asm("r1") = 0x20024;
  __asm volatile("bkpt 0xab" : : "r"(r0), "r"(r1));
  for (;;) {}
}

static void SysTick_Handler(void) { etforge_systick_wraps++; }

__attribute__((section(".vectors"), used)) const void* etforge_vectors[32] = {
    &__stack_top, (void*)Reset_Handler,
    [2 ... 14] = (void*)Fault_Handler,
    [15] = (void*)SysTick_Handler,
    [16 ... 31] = (void*)Fault_Handler,
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

#define SYST_CSR (*(volatile uint32_t*)0xE000E010)
#define SYST_RVR (*(volatile uint32_t*)0xE000E014)
#define SYST_CVR (*(volatile uint32_t*)0xE000E018)
#define SYST_RELOAD 0xFFFFFFu

/* SysTick on the processor clock, interrupt on each wrap. */
void etforge_ticks_start(void) {
  SYST_RVR = SYST_RELOAD;
  SYST_CVR = 0;
  SYST_CSR = 7u; /* CLKSOURCE = processor clock, TICKINT, ENABLE */
  while (SYST_CVR == 0u) {} /* the first tick loads RVR; before it the count would read as a wrap */
  etforge_systick_wraps = 0;
}

/* Processor-clock ticks since etforge_ticks_start (0 before). */
uint64_t etforge_ticks(void) {
  uint32_t w, v;
  do {
    w = etforge_systick_wraps;
    v = SYST_CVR;
  } while (w != etforge_systick_wraps);
  return (uint64_t)w * (SYST_RELOAD + 1u) + (SYST_RELOAD - v);
}

void _init(void) {}
void _fini(void) {}
void* __dso_handle = 0;

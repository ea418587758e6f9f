"""MemoryRecords on the operator's side: their ``Active`` condition and audit, and the ``MemoryInjected`` record.

May import: profiles (the profiles' memory policy), the runtime, the scheduler, the door and the
pure core. Must not: be imported by other handlers.
"""

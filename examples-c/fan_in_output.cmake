# What a run of the fan-in example (run_fan_in.sh, four producers of 100000 messages) prints,
# in C and C++ alike: the consumer's list of producers once it has heard from all four, every
# slot free after their ends, and the count. Producers end in any order, so their lines are
# not matched one by one: the consumer ends only after all four ends, each checked.
set(LF_FAN_IN_OUTPUT
  "heard from all 4 producers; lf_channel_peers:\n  slot 0: [a-z]+, pid [1-9][0-9]*, host [^\n]+, route shm\n.*every producer has ended; lf_channel_peers:\n  slot 0: free\n  slot 1: free\n  slot 2: free\n  slot 3: free\nconsumer: 400000 messages from 4 producers, each producer's in order\nfan-in demo passed")

# What a run of the fan-out example (run_fan_out.sh, four consumers of 100000 messages) prints,
# in C and C++ alike: the producer's list of its four consumers, each version of the weights
# released by every consumer before the next, the count, then each consumer's check. Consumers
# end in any order, so their lines are not matched one by one: the script checks that each
# exited 0 and is in the producer's list.
set(LF_FAN_OUT_OUTPUT
  "producer: 4 consumers attached; lf_channel_peers:\n  slot 0: alive, pid [1-9][0-9]*, host [^\n]+, route shm\n  slot 1: alive, pid [1-9][0-9]*, host [^\n]+, route shm\n  slot 2: alive, pid [1-9][0-9]*, host [^\n]+, route shm\n  slot 3: alive, pid [1-9][0-9]*, host [^\n]+, route shm\nproducer: weights version 0 released by every consumer\nproducer: weights version 1 released by every consumer\nproducer: weights version 2 released by every consumer\nproducer: weights version 3 released by every consumer\nproducer: sent 100000 messages and 4 versions of the weights to 4 consumers\nconsumer [0-9]+: 100000 messages in order and 4 versions of the weights, each byte checked\n.*fan-out demo passed")

#!/usr/bin/env perl
# A jobd handler in Perl: the payload is text; it counts the words and stores the count.
# Exit 0: done. Exit 65 (EX_DATAERR): bad input, dead-letter it. Exit 75 (EX_TEMPFAIL): retry later.
use strict;
use warnings;
use File::Path qw(make_path);

my ($EX_DATAERR, $EX_TEMPFAIL) = (65, 75);
my $job_id = $ENV{JOBD_JOB_ID};    # stable across retries: the key for idempotency
my $dir = ($ENV{EXAMPLE_STATE} // '/tmp/jobd-example') . '/words';
make_path($dir);
my $target = "$dir/$job_id";
if (-e $target) {
    print "job $job_id already counted\n";
    exit 0;
}

local $/;                          # read all of stdin at once
my $text = <STDIN> // '';
if ($text !~ /\S/) {
    print STDERR "empty payload: nothing to count\n";
    exit $EX_DATAERR;
}
my $count = () = $text =~ /\S+/g;

open(my $out, '>', "$target.tmp") or do {
    print STDERR "cannot write $target.tmp: $!; try again later\n";
    exit $EX_TEMPFAIL;
};
print $out "$count\n";
close($out);
rename("$target.tmp", $target) or exit $EX_TEMPFAIL;    # atomic: no half-written result
print "counted $count words (attempt $ENV{JOBD_ATTEMPT})\n";
exit 0;

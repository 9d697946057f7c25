#!/usr/bin/env bash
# Set up, make a small speech corpus locally (espeak-ng, no downloads), write a Lhotse
# manifest of cuts, pack it, mount it, read cuts with ordinary tools, and unmount.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
work=$(mktemp -d /tmp/cutfs-demo.XXXXXX)
mountpoint="$work/mnt"
mkdir -p "$mountpoint"
trap 'fusermount3 -u "$mountpoint" 2>/dev/null || true' EXIT

echo "== making a corpus of 30 s recordings in $work/audio"
.venv/bin/python tests/support/corpus.py "$work/audio" 30 | sed 's/^/   /' | head -6
echo "   ..."

echo "== writing Lhotse manifests: one recording each, 10 s cuts every 5 s"
.venv/bin/python - "$work" <<'PY'
import json, os, sys, subprocess
work = sys.argv[1]
audio = os.path.join(work, "audio")
with open(os.path.join(work, "demo_recordings.jsonl"), "w") as recs, \
        open(os.path.join(work, "demo_supervisions.jsonl"), "w") as sups:
    for name in sorted(os.listdir(audio)):
        if name.startswith("."):
            continue
        rec_id = name.rsplit(".", 1)[0]
        info = subprocess.run(["ffprobe", "-v", "error", "-show_entries", "stream=sample_rate",
                               "-of", "csv=p=0", os.path.join(audio, name)],
                              capture_output=True, text=True, check=True).stdout.split()[0]
        recs.write(json.dumps({"id": rec_id, "sampling_rate": int(info), "duration": 30.0,
                               "num_samples": 30 * int(info),
                               "sources": [{"type": "file", "channels": [0],
                                            "source": os.path.join(audio, name)}]}) + "\n")
        for start in range(0, 20, 5):
            sups.write(json.dumps({"id": f"{rec_id}/seg{start:02d}", "recording_id": rec_id,
                                   "start": start, "duration": 10.0, "channel": 0,
                                   "text": "demo", "speaker": "espeak"}) + "\n")
PY

echo "== cutfs pack"
.venv/bin/cutfs pack "$work/demo_recordings.jsonl" "$work/demo_supervisions.jsonl" -o "$work/shards"

echo "== cutfs mount"
.venv/bin/cutfs mount "$work/shards" "$mountpoint"
ls "$mountpoint"
echo "   $(wc -l < "$mountpoint/wav.scp") cuts in wav.scp; the first three:"
head -3 "$mountpoint/wav.scp" | sed 's/^/   /'

cut="$mountpoint/cuts/mp3_vbr_stereo_44k/seg15.wav"
echo "== reading $cut"
echo "-- ls -l:  $(ls -l "$cut")"
echo "-- soxi:   $(soxi "$cut" | grep -E 'Sample Rate|Duration' | tr -s ' ' | paste -sd';')"
echo "-- ffprobe: $(ffprobe -v error -show_entries stream=codec_name,sample_rate,channels,duration -of compact=p=0 "$cut")"
echo "-- soundfile: $(.venv/bin/python -c "import soundfile, sys; d, r = soundfile.read(sys.argv[1]); print(d.shape, r, 'Hz')" "$cut")"
echo "-- python wave: $(.venv/bin/python -c "import wave, sys; w = wave.open(sys.argv[1]); print(w.getnframes(), 'frames at', w.getframerate(), 'Hz')" "$cut")"
echo "-- compare with ffmpeg decoding the original from its start:"
ffmpeg -v error -i "$work/audio/mp3_vbr_stereo_44k.mp3" -ss 15 -t 10 -af "pan=mono|c0=c0" -f s16le - | cmp - <(tail -c +45 "$cut") \
    && echo "   identical samples" || echo "   (differs: see docs/design.md on lossy codecs)"

echo "== unmounting"
fusermount3 -u "$mountpoint"
trap - EXIT
echo "demo done; files are in $work"

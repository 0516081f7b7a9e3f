"""The file extensions a folder or glob input takes as audio: what the decoders read
(pipeline.audio: libsndfile, and FFmpeg through pipeline.audio_av for every other
container). One list, read by the folder scan (pipeline.sources) and the docs' check."""
from __future__ import annotations

# libsndfile's containers (FFmpeg reads them too)
SNDFILE_EXTENSIONS = (".wav", ".wave", ".flac", ".ogg", ".oga", ".mp3", ".opus", ".aiff", ".aif", ".aifc",
                      ".au", ".snd", ".caf", ".w64", ".rf64")
# FFmpeg's: MP4/M4A/AAC, Matroska/WebM, AMR, ASF/WMA, and the audio of video containers
FFMPEG_EXTENSIONS = (".m4a", ".m4b", ".mp4", ".m4v", ".mov", ".3gp", ".3g2", ".aac", ".adts", ".webm",
                     ".mka", ".mkv", ".amr", ".awb", ".wma", ".wmv", ".asf", ".ac3", ".eac3", ".mp2",
                     ".wv", ".ape", ".tta", ".spx", ".avi", ".flv", ".mpg", ".mpeg", ".ts", ".mts")
AUDIO_EXTENSIONS = SNDFILE_EXTENSIONS + FFMPEG_EXTENSIONS
